"""The component's export, used only under WebAssembly (imported by :func:`carteiro.handler`).

Converts the WIT message into a :class:`~carteiro.Message`, calls the handler and converts
its :class:`~carteiro.Verdict` back. An exception that escapes the handler becomes a
*trap*: the gateway classifies it as a plugin failure of that delivery. Before trapping it
prints the traceback to stderr (forwarded to the gateway's logs) and then a two-line
summary in the shape the gateway reads a Rust panic from, so the failure reason carries the
exception and its last frames::

    python handler panicked at app.py:5 in parse < app.py:11 in handle:
    KeyError: 'curso_id'
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from typing import NoReturn

from _carteiro_wit.imports import types as _types

from carteiro import _registry as _handler
from carteiro.message import Header, Message
from carteiro.verdict import Verdict

# The gateway filters levels itself; let every record (trace included) reach the host.
logging.getLogger().setLevel(1)

_FRAMES = 3
_SUMMARY_MAX = 600
_THIS_FILE = __file__


def _to_message(wit: _types.Message) -> Message:
    return Message._from_host(
        wit.routing_key,
        wit.body,
        wit.id,
        wit.exchange,
        tuple([Header(h.name, h.value) for h in wit.headers]) if wit.headers else (),
        wit.content_type,
        wit.attempt,
        wit.redelivered,
    )


def _to_wit(verdict: Verdict) -> _types.Verdict:
    if verdict.kind == "ack":
        return _types.Verdict_Ack()
    if verdict.kind == "retry":
        return _types.Verdict_Retry(_types.RetryRequest(verdict.delay_ms, verdict.reason or ""))
    return _types.Verdict_DeadLetter(verdict.reason or "")


def _short(filename: str) -> str:
    # componentize-py maps each python path to /0/, /1/, ...
    return re.sub(r"^/\d+/", "", filename)


def trap_summary(exc: BaseException) -> str:
    """The two lines printed last before the trap: where, then what."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != _THIS_FILE][
        -_FRAMES:
    ]
    where = " < ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in reversed(frames))
    what = " ".join(traceback.format_exception_only(exc)[-1].split())
    if len(what) > _SUMMARY_MAX:
        what = what[: _SUMMARY_MAX - 1] + "…"
    return f"python handler panicked at {where or '<unknown>'}:\n{what}\n"


def _trap(exc: BaseException) -> NoReturn:
    try:
        sys.stderr.write("".join(traceback.format_exception(exc)))
        sys.stderr.write(trap_summary(exc))
        sys.stderr.flush()
    finally:
        os.abort()


class CarteiroWit:
    """The world's export class that componentize-py instantiates."""

    def handle(self, message: _types.Message) -> _types.Verdict:
        try:
            fn = _handler.registered()
            if fn is None:
                raise RuntimeError("no function is marked with @carteiro.handler")
            return _to_wit(_handler.check_verdict(fn, fn(_to_message(message))))
        except BaseException as exc:  # noqa: BLE001 - every escape is a trap
            _trap(exc)


class CarteiroBatchWit(CarteiroWit):
    """The export class of the ``batch-handler`` world (:func:`carteiro.batch_handler`)."""

    def handle(self, message: _types.Message) -> _types.Verdict:
        return self.handle_batch_of([message], attribute=False)[0]

    def handle_batch(self, messages: list[_types.Message]) -> list[_types.Verdict]:
        return self.handle_batch_of(messages, attribute=True)

    @staticmethod
    def handle_batch_of(messages: list[_types.Message], *, attribute: bool) -> list[_types.Verdict]:
        from carteiro._batch import Batch, check_verdicts

        try:
            fn = _handler.registered_batch()
            if fn is None:
                raise RuntimeError("no function is marked with @carteiro.batch_handler")
            batch = Batch([_to_message(m) for m in messages], attribute=attribute)
            verdicts = check_verdicts(fn, fn(batch), len(messages))  # type: ignore[arg-type]
            if len(verdicts) != len(messages):
                # The host retries the whole batch; say why in its words too.
                reason = (
                    f"the batch handler returned {len(verdicts)} verdicts for "
                    f"{len(messages)} messages"
                )
                return [_to_wit(Verdict.retry(reason)) for _ in messages]
            return [_to_wit(v) for v in verdicts]
        except BaseException as exc:  # noqa: BLE001 - every escape is a trap
            _trap(exc)
