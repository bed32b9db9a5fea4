"""Events to publish, committed atomically with the message's kv writes.

The gateway's relay publishes them after commit, at least once, with the event id as the
AMQP ``message-id``. Events emitted by a message that ends in retry or dead-letter are
discarded. Every function raises :class:`~carteiro.OutboxError` (``InvalidEvent``,
``TooManyEvents``, ``PayloadTooLarge``).
"""

from __future__ import annotations

import json as _json
from typing import Any

from carteiro._host import backend
from carteiro._host.event import Event
from carteiro.message import HeadersLike, _headers

__all__ = ["JSON", "emit", "emit_json"]

#: Content type set by :func:`emit_json`.
JSON = "application/json"

Payload = bytes | bytearray | memoryview | str


def emit(
    exchange: str,
    routing_key: str,
    payload: Payload,
    *,
    headers: HeadersLike | None = None,
    content_type: str | None = None,
) -> str:
    """Queues an event for publication if the message acks; returns its id (a UUIDv7).

    ``payload`` is bytes, or text sent as UTF-8. ``headers`` is a mapping or (name, value)
    pairs.
    """
    body = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
    pairs = [(h.name, h.value) for h in _headers(headers)] if headers else []
    return backend.outbox_emit(Event(exchange, routing_key, pairs, content_type, body))


def emit_json(
    exchange: str, routing_key: str, value: Any, *, headers: HeadersLike | None = None
) -> str:
    """Queues ``value`` as a compact JSON event (content type ``application/json``).

    Raises :class:`TypeError` if ``value`` cannot be encoded as JSON.
    """
    payload = _json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return emit(exchange, routing_key, payload, headers=headers, content_type=JSON)
