"""The event a handler hands to the backend: one shape for the mock and the real host."""

from __future__ import annotations

from typing import NamedTuple


class Event(NamedTuple):
    """An event as the handler asked for it, before the host checks it."""

    exchange: str
    routing_key: str
    headers: list[tuple[str, str]]
    content_type: str | None
    payload: bytes
