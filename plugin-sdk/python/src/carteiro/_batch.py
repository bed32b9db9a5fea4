"""The :class:`Batch` a batch handler is given, and the check of what it returns.

Below :mod:`carteiro.batch` (the decorator), :mod:`carteiro._component` (the export glue)
and :mod:`carteiro.testing`, so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import SupportsIndex, overload

from carteiro import _registry
from carteiro._host import backend
from carteiro._registry import where
from carteiro.message import Message
from carteiro.verdict import Verdict

BatchFn = Callable[["Batch"], list[Verdict]]


class Batch(list[Message]):
    """The messages of one batch, in delivery order; a ``list`` that attributes host calls
    to the message last taken from it."""

    def __init__(self, messages: list[Message], *, attribute: bool = True) -> None:
        super().__init__(messages)
        self._attribute = attribute

    def _take(self, index: int) -> None:
        if self._attribute:
            backend.batch_item(index)

    def __iter__(self) -> Iterator[Message]:
        for index in range(len(self)):
            self._take(index)
            yield list.__getitem__(self, index)

    @overload
    def __getitem__(self, index: SupportsIndex) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...
    def __getitem__(self, index: SupportsIndex | slice) -> Message | list[Message]:
        if isinstance(index, slice):
            return list.__getitem__(self, index)
        position = index.__index__()
        if position < 0:
            position += len(self)
        message = list.__getitem__(self, position)
        self._take(position)
        return message


def check_verdicts(fn: BatchFn, verdicts: object, count: int) -> list[Verdict]:
    """``verdicts`` if it is a list of ``count`` verdicts; a ``TypeError`` naming ``fn``
    otherwise (the gateway retries every message of a batch answered with another count)."""
    if not isinstance(verdicts, list):
        raise TypeError(
            f"batch handler {where(fn)} returned {verdicts!r}; it must return a list of "
            "carteiro.Verdict, one per message"
        )
    for verdict in verdicts:
        _registry.check_verdict(fn, verdict)
    return verdicts
