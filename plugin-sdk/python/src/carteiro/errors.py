"""Typed errors raised by the host calls, mirroring the WIT variants.

Their text is the Rust SDK's, so a reason reads the same whatever language the handler
is written in. Each error knows its conventional verdict: :meth:`KvError.to_verdict`.
"""

from __future__ import annotations

from typing import ClassVar

from carteiro.verdict import Verdict


class CarteiroError(Exception):
    """Base class of every error the SDK raises."""

    def to_verdict(self) -> Verdict:
        """The conventional verdict for this error: dead-letter with its text."""
        return Verdict.dead_letter(str(self))


class KvError(CarteiroError):
    """A kv operation failed."""

    #: True when trying again later may succeed (only :class:`StoreUnavailable`).
    transient: bool = False


class _WhyError(CarteiroError):
    """An error about ``why``: its text is the class's ``_text`` with ``{why}`` filled in."""

    _text: ClassVar[str]

    def __init__(self, why: str) -> None:
        super().__init__(self._text.format(why=why))
        self.why = why


class _LimitError(CarteiroError):
    """An error about a ``limit``: its text is the class's ``_text`` with ``{limit}`` filled in."""

    _text: ClassVar[str]

    def __init__(self, limit: int) -> None:
        super().__init__(self._text.format(limit=limit))
        self.limit = limit


class InvalidKey(_WhyError, KvError):
    """The key is empty, too long, or contains a NUL character."""

    _text = "kv: invalid key: {why}"


class ValueTooLarge(_LimitError, KvError):
    """The value is larger than the host accepts; ``limit`` is in bytes."""

    _text = "kv: value larger than the {limit}-byte limit"


class StoreUnavailable(_WhyError, KvError):
    """The store could not be reached; returning a retry is usually right."""

    transient = True
    _text = "kv unavailable: {why}"

    def to_verdict(self) -> Verdict:
        """Retry: the store may answer later."""
        return Verdict.retry(str(self))


class InvalidValue(_WhyError, KvError):
    """SDK-side only: a stored value is not the text, JSON or integer asked for."""

    _text = "kv: {why}"


class OutboxError(CarteiroError):
    """An outbox emit failed. Outbox errors are permanent for a given message."""


class InvalidEvent(_WhyError, OutboxError):
    """An exchange, routing key or header is not acceptable (NUL byte, too long, ...)."""

    _text = "outbox: invalid event: {why}"


class TooManyEvents(_LimitError, OutboxError):
    """This message already emitted the maximum number of events (``limit``)."""

    _text = "outbox: too many events for one message (limit {limit})"


class PayloadTooLarge(_LimitError, OutboxError):
    """The payload is larger than the host accepts; ``limit`` is in bytes."""

    _text = "outbox: payload larger than the {limit}-byte limit"


class BodyError(CarteiroError, ValueError):
    """The message body is not the expected UTF-8 text or JSON.

    ``description`` says what is wrong without the position, in the Rust SDK's words
    (e.g. ``key must be a string``), good for a dead-letter reason; ``line`` and ``column``
    are 1-based (0 when unknown); ``is_syntax`` is true when the body is not JSON at all.
    """

    def __init__(
        self, description: str, line: int = 0, column: int = 0, is_syntax: bool = True
    ) -> None:
        text = description if line == 0 else f"{description} at line {line} column {column}"
        super().__init__(text)
        self.description = description
        self.line = line
        self.column = column
        self.is_syntax = is_syntax

    def to_verdict(self) -> Verdict:
        """Dead-letter: a body that cannot be decoded will not decode on retry either."""
        return Verdict.dead_letter(f"invalid body: {self}")
