"""The plugin's variables from the operator's TOML (``[plugins.NAME.variables]``).

Variables are the only configuration a handler sees: there is no environment, filesystem,
network or command line inside the sandbox.
"""

from __future__ import annotations

from typing import TypeVar, overload

from carteiro._host import backend

__all__ = ["get", "all"]

T = TypeVar("T")


@overload
def get(name: str) -> str | None: ...
@overload
def get(name: str, default: T) -> str | T: ...
def get(name: str, default: object = None) -> object:
    """The variable called ``name``, or ``default`` when the operator did not set it."""
    value = backend.config_get(name)
    return default if value is None else value


def all() -> dict[str, str]:  # noqa: A001 - the verb of the WIT interface
    """Every variable, by name (sorted)."""
    return dict(sorted(backend.config_all()))
