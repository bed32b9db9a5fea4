"""Batch handlers: :func:`batch_handler` and the :class:`Batch` it is given.

A batch handler takes the messages of one ``handle-batch`` call (a route with ``batch``)
and returns one :class:`~carteiro.Verdict` per message, in order::

    @carteiro.batch_handler
    def handle(batch: carteiro.Batch) -> list[Verdict]:
        return [handle_one(msg) for msg in batch]

Taking message ``i`` from the batch (iterating, or ``batch[i]``) tells the host that the
``kv``, ``outbox`` and logging calls that follow belong to message ``i``: its kv writes and
events commit only if its own verdict is ack, and its kv reads see the committed store and
its own writes only. Handle the messages one after another. Isolation is per batch, not per
message: module globals set while handling one message are seen by the next ones.
"""

from __future__ import annotations

import sys
from typing import TypeVar

from carteiro import _registry
from carteiro._batch import Batch, BatchFn, check_verdicts
from carteiro._decorator import check_handler_function

F = TypeVar("F", bound=BatchFn)

__all__ = ["Batch", "batch_handler", "check_verdicts"]


def batch_handler(fn: F) -> F:
    """Marks ``fn(batch: Batch) -> list[Verdict]`` as the component's batch handler.

    The component then exports ``handle-batch`` (world ``batch-handler``) and ``handle`` (a
    batch of one, for routes without ``batch``). Use it once per component, instead of
    :func:`carteiro.handler`. Natively it only records the function: tests call it through
    :func:`carteiro.testing.run_batch`.
    """
    check_handler_function(
        fn, "batch_handler", "batch", "`def handle(batch: Batch) -> list[Verdict]`"
    )
    if sys.platform == "wasi":
        from carteiro import _component

        sys.modules[fn.__module__].CarteiroWit = _component.CarteiroBatchWit  # type: ignore[attr-defined]
    _registry.register_batch(fn)
    return fn
