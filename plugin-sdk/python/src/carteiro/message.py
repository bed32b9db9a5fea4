"""The delivery a handler receives: :class:`Message` and its :class:`Header` s."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from carteiro import _json
from carteiro.errors import BodyError

#: Headers as given to the constructors: a mapping, or (name, value) pairs (repeats allowed).
HeadersLike = Mapping[str, str] | Iterable[tuple[str, str]]


class Header(NamedTuple):
    """One AMQP header, flattened to text by the host (numbers and booleans as text)."""

    name: str
    value: str


def _headers(headers: HeadersLike) -> tuple[Header, ...]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return tuple(Header(str(name), str(value)) for name, value in pairs)


@dataclass(frozen=True)
class Message:
    """The message being handled.

    The host builds it from the AMQP delivery; tests build it with keyword arguments,
    :meth:`from_json` or :meth:`from_text`.
    """

    #: Routing key the message was originally published with.
    routing_key: str = ""
    #: The raw body.
    body: bytes = b""
    #: The AMQP ``message-id``, if the publisher set one.
    id: str | None = None
    #: Exchange the message was originally published to (``""`` is the default exchange).
    exchange: str = ""
    #: AMQP headers, flattened to text, in the order they came.
    headers: tuple[Header, ...] = field(default=())
    #: The AMQP ``content-type`` property, if set.
    content_type: str | None = None
    #: 1 on the first delivery; counted by Carteiro across retries.
    attempt: int = 1
    #: The broker redelivered this message (a consumer died holding it).
    redelivered: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            object.__setattr__(self, "body", self.body.encode("utf-8"))
        elif not isinstance(self.body, bytes):
            object.__setattr__(self, "body", bytes(self.body))
        if not (
            isinstance(self.headers, tuple) and all(isinstance(h, Header) for h in self.headers)
        ):
            object.__setattr__(self, "headers", _headers(self.headers))

    @classmethod
    def _from_host(
        cls,
        routing_key: str,
        body: bytes,
        id: str | None,  # noqa: A002 - the field's name
        exchange: str,
        headers: tuple[Header, ...],
        content_type: str | None,
        attempt: int,
        redelivered: bool,
    ) -> Message:
        """The message the host handed over, whose fields have their types already: built
        without the checks and conversions of ``__init__`` (a frozen dataclass sets each
        field through ``object.__setattr__``), which ran on every delivery."""
        message = object.__new__(cls)
        message.__dict__.update(
            routing_key=routing_key,
            body=body,
            id=id,
            exchange=exchange,
            headers=headers,
            content_type=content_type,
            attempt=attempt,
            redelivered=redelivered,
        )
        return message

    @classmethod
    def from_json(cls, routing_key: str, value: Any, **fields: Any) -> Message:
        """A message whose body is ``value`` as JSON, content type ``application/json``."""
        fields.setdefault("content_type", "application/json")
        body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return cls(routing_key=routing_key, body=body, **fields)

    @classmethod
    def from_text(cls, routing_key: str, text: str, **fields: Any) -> Message:
        """A message whose body is ``text`` in UTF-8."""
        return cls(routing_key=routing_key, body=text.encode("utf-8"), **fields)

    def header(self, name: str) -> str | None:
        """The value of the first header called ``name`` (exact, case-sensitive match)."""
        for header in self.headers:
            if header.name == name:
                return header.value
        return None

    def text(self) -> str:
        """The body as UTF-8 text; raises :class:`~carteiro.BodyError` if it is not."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BodyError(f"body is not UTF-8 (invalid byte at offset {e.start})") from None

    def json(self) -> Any:
        """The body decoded from JSON; raises :class:`~carteiro.BodyError` if it is not JSON.

        The error's ``description`` uses the Rust SDK's words, e.g. ``key must be a string``
        or ``EOF while parsing an object``.
        """
        return _json.loads(self.body)
