"""Which function is the component's handler, and the check of what it returns.

Below both :mod:`carteiro._decorator`, which records the function, and
:mod:`carteiro._component` and :mod:`carteiro.testing`, which call it, so none of them has to
import another for it.
"""

from __future__ import annotations

from collections.abc import Callable

from carteiro.message import Message
from carteiro.verdict import Verdict

HandlerFn = Callable[[Message], Verdict]

_registered: HandlerFn | None = None


def where(fn: Callable[..., object]) -> str:
    """``module.name (file:line)`` of ``fn``, for error messages."""
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


_registered_batch: Callable[..., object] | None = None


def register_batch(fn: Callable[..., object]) -> None:
    """Records ``fn`` as the batch handler (:func:`carteiro.batch_handler`)."""
    global _registered_batch
    _registered_batch = fn


def registered_batch() -> Callable[..., object] | None:
    """The function marked with :func:`carteiro.batch_handler` last, if any."""
    return _registered_batch


def register(fn: HandlerFn) -> None:
    """Records ``fn`` as the handler."""
    global _registered
    _registered = fn


def registered() -> HandlerFn | None:
    """The function marked with :func:`carteiro.handler` last, if any."""
    return _registered


def check_verdict(fn: HandlerFn, verdict: object) -> Verdict:
    """``verdict`` if it is a :class:`Verdict`; a :class:`TypeError` naming ``fn`` otherwise."""
    if not isinstance(verdict, Verdict):
        raise TypeError(
            f"handler {where(fn)} returned {verdict!r}; it must return a carteiro.Verdict "
            "(Verdict.ack(), Verdict.retry(reason), Verdict.dead_letter(reason))"
        )
    return verdict
