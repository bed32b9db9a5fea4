"""The :func:`handler` decorator: marks the function the component exports as ``handle``."""

from __future__ import annotations

import inspect
import sys
from typing import TypeVar

from carteiro import _registry
from carteiro._registry import HandlerFn, where

F = TypeVar("F", bound=HandlerFn)


def handler(fn: F) -> F:
    """Marks ``fn(msg: Message) -> Verdict`` as the component's handler; returns it unchanged.

    Use it exactly once per component, on a plain (not ``async``) function taking one
    message. Natively it only records the function (tests call it directly or through
    :func:`carteiro.testing.run`); when componentize-py builds the module it also exports
    the function as the component's ``handle``.
    """
    if not callable(fn):
        raise TypeError(f"@carteiro.handler needs a function, not {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"@carteiro.handler: {where(fn)} is async; a handler is a plain function "
            "`def handle(msg: Message) -> Verdict`"
        )
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise TypeError(
            f"@carteiro.handler: {where(fn)} must take exactly one argument, the message: "
            "`def handle(msg: Message) -> Verdict`"
        ) from None
    except ValueError:  # no signature (a builtin): let the call tell
        pass
    if sys.platform == "wasi":
        previous = _registry.registered()
        if previous is not None and previous is not fn:
            raise RuntimeError(
                f"@carteiro.handler used twice in one component: {where(previous)} and "
                f"{where(fn)}"
            )
        # Imported here: it needs the generated bindings, which exist only under wasm.
        from carteiro import _component

        # componentize-py looks for the world's export class in the app module.
        sys.modules[fn.__module__].CarteiroWit = _component.CarteiroWit  # type: ignore[attr-defined]
    _registry.register(fn)
    return fn
