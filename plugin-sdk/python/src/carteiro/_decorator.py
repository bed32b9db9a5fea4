"""The :func:`handler` decorator: marks the function the component exports as ``handle``;
and the check of the decorated function it shares with :func:`carteiro.batch_handler`."""

from __future__ import annotations

import inspect
import sys
from typing import TypeVar

from carteiro import _registry
from carteiro._registry import HandlerFn, where

F = TypeVar("F", bound=HandlerFn)


def check_handler_function(fn: object, decorator: str, argument: str, shape: str) -> None:
    """A :class:`TypeError` unless ``fn``, marked with ``@carteiro.<decorator>``, is a plain
    (not ``async``) function taking one ``argument``; ``shape`` shows how it looks."""
    if not callable(fn):
        raise TypeError(f"@carteiro.{decorator} needs a function, not {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        kind = decorator.replace("_", " ")
        raise TypeError(
            f"@carteiro.{decorator}: {where(fn)} is async; a {kind} is a plain function {shape}"
        )
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise TypeError(
            f"@carteiro.{decorator}: {where(fn)} must take exactly one argument, "
            f"the {argument}: {shape}"
        ) from None
    except ValueError:  # no signature (a builtin): let the call tell
        pass


def handler(fn: F) -> F:
    """Marks ``fn(msg: Message) -> Verdict`` as the component's handler; returns it unchanged.

    Use it exactly once per component, on a plain (not ``async``) function taking one
    message. Natively it only records the function (tests call it directly or through
    :func:`carteiro.testing.run`); when componentize-py builds the module it also exports
    the function as the component's ``handle``.
    """
    check_handler_function(fn, "handler", "message", "`def handle(msg: Message) -> Verdict`")
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
