"""Typed errors raised by the host calls, mirroring the WIT variants.

Their text is the Rust SDK's, so a reason reads the same whatever language the handler
is written in. Each error knows its conventional verdict: :meth:`KvError.to_verdict`.
"""

from __future__ import annotations

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


class InvalidKey(KvError):
    """The key is empty, too long, or contains a NUL character."""

    def __init__(self, why: str) -> None:
        super().__init__(f"kv: invalid key: {why}")
        self.why = why


class ValueTooLarge(KvError):
    """The value is larger than the host accepts; ``limit`` is in bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"kv: value larger than the {limit}-byte limit")
        self.limit = limit


class StoreUnavailable(KvError):
    """The store could not be reached; returning a retry is usually right."""

    transient = True

    def __init__(self, why: str) -> None:
        super().__init__(f"kv unavailable: {why}")
        self.why = why

    def to_verdict(self) -> Verdict:
        """Retry: the store may answer later."""
        return Verdict.retry(str(self))


class InvalidValue(KvError):
    """SDK-side only: a stored value is not the text, JSON or integer asked for."""

    def __init__(self, why: str) -> None:
        super().__init__(f"kv: {why}")
        self.why = why


class OutboxError(CarteiroError):
    """An outbox emit failed. Outbox errors are permanent for a given message."""


class InvalidEvent(OutboxError):
    """An exchange, routing key or header is not acceptable (NUL byte, too long, ...)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"outbox: invalid event: {why}")
        self.why = why


class TooManyEvents(OutboxError):
    """This message already emitted the maximum number of events (``limit``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"outbox: too many events for one message (limit {limit})")
        self.limit = limit


class PayloadTooLarge(OutboxError):
    """The payload is larger than the host accepts; ``limit`` is in bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"outbox: payload larger than the {limit}-byte limit")
        self.limit = limit


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
