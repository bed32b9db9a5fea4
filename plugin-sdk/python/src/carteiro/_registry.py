"""The :func:`handler` decorator: marks the function the component exports as ``handle``."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TypeVar

from carteiro.message import Message
from carteiro.verdict import Verdict

HandlerFn = Callable[[Message], Verdict]
F = TypeVar("F", bound=HandlerFn)

_registered: HandlerFn | None = None


def _where(fn: Callable[..., object]) -> str:
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


def handler(fn: F) -> F:
    """Marks ``fn(msg: Message) -> Verdict`` as the component's handler; returns it unchanged.

    Use it exactly once per component, on a plain (not ``async``) function taking one
    message. Natively it only records the function (tests call it directly or through
    :func:`carteiro.testing.run`); when componentize-py builds the module it also exports
    the function as the component's ``handle``.
    """
    global _registered
    if not callable(fn):
        raise TypeError(f"@carteiro.handler needs a function, not {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@carteiro.handler: {_where(fn)} is async; a handler is a plain function "
            "`def handle(msg: Message) -> Verdict`"
        )
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise TypeError(
            f"@carteiro.handler: {_where(fn)} must take exactly one argument, the message: "
            "`def handle(msg: Message) -> Verdict`"
        ) from None
    except ValueError:  # no signature (a builtin): let the call tell
        pass
    if sys.platform == "wasi":
        if _registered is not None and _registered is not fn:
            raise RuntimeError(
                f"@carteiro.handler used twice in one component: {_where(_registered)} and "
                f"{_where(fn)}"
            )
        from carteiro import _component

        # componentize-py looks for the world's export class in the app module.
        sys.modules[fn.__module__].CarteiroWit = _component.CarteiroWit  # type: ignore[attr-defined]
    _registered = fn
    return fn


def registered() -> HandlerFn | None:
    """The function marked with :func:`handler` last, if any."""
    return _registered


def check_verdict(fn: HandlerFn, verdict: object) -> Verdict:
    """``verdict`` if it is a :class:`Verdict`; a :class:`TypeError` naming ``fn`` otherwise."""
    if not isinstance(verdict, Verdict):
        raise TypeError(
            f"handler {_where(fn)} returned {verdict!r}; it must return a carteiro.Verdict "
            "(Verdict.ack(), Verdict.retry(reason), Verdict.dead_letter(reason))"
        )
    return verdict
