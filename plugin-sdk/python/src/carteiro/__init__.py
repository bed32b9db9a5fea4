"""Carteiro handler SDK for Python.

A handler is a function ``(Message) -> Verdict`` marked with :func:`handler`, built into a
WebAssembly component with componentize-py::

    import carteiro
    from carteiro import Message, Verdict, kv, outbox

    @carteiro.handler
    def handle(msg: Message) -> Verdict:
        try:
            order = msg.json()
            kv.incr("orders")
            outbox.emit_json("carteiro.events", "order.seen", order)
        except carteiro.CarteiroError as e:  # bad body/event: dead-letter; store down: retry
            return e.to_verdict()
        return Verdict.ack()

Layout:

- :class:`Message`, :class:`Header` (``message.py``): the delivery, with ``json``,
  ``text`` and ``header``; body JSON errors in the Rust SDK's words (``_json.py``).
- :class:`Verdict` (``verdict.py``): ack, retry (optionally after a delay), dead-letter.
- :mod:`carteiro.kv`, :mod:`carteiro.outbox`, :mod:`carteiro.config`: the host imports.
- ``log.py``: a :class:`logging.Handler` routing the standard ``logging`` module to the host.
- ``errors.py``: typed exceptions (``KvError``, ``OutboxError``, ``BodyError`` and their
  subclasses), each with ``to_verdict()``.
- :mod:`carteiro.rules`: the gateway's kv key and event checks (port of the Rust SDK's).
- ``batch.py``: :func:`batch_handler` and :class:`Batch` (a route with ``batch``: one call
  for several messages, host calls attributed to the message last taken from the batch).
- ``_decorator.py``: the :func:`handler` decorator; ``_registry.py``: the function it
  marked; ``_component.py``: the export glue and the trap on an uncaught exception
  (WebAssembly only).
- ``_host/``: the backend — real imports under WebAssembly (``wasm.py``, the only user of
  the generated bindings), an in-memory mock elsewhere (``mock.py``); both take the
  ``Event`` of ``event.py``.
- :mod:`carteiro.testing`: drive the mock from ``pytest`` (fixture ``mock_host``).
"""

from __future__ import annotations

from carteiro import config, kv, outbox
from carteiro import log as _log
from carteiro.errors import (
    BodyError,
    CarteiroError,
    InvalidEvent,
    InvalidKey,
    InvalidValue,
    KvError,
    OutboxError,
    PayloadTooLarge,
    StoreUnavailable,
    TooManyEvents,
    ValueTooLarge,
)
from carteiro._decorator import handler
from carteiro._batch import Batch
from carteiro.batch import batch_handler
from carteiro.message import Header, Message
from carteiro.verdict import Verdict

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BodyError",
    "CarteiroError",
    "Header",
    "InvalidEvent",
    "InvalidKey",
    "InvalidValue",
    "KvError",
    "Message",
    "OutboxError",
    "PayloadTooLarge",
    "StoreUnavailable",
    "TooManyEvents",
    "ValueTooLarge",
    "Verdict",
    "batch_handler",
    "config",
    "handler",
    "kv",
    "outbox",
]

_log.install()
