"""The backend behind kv, outbox, log and config.

Under WebAssembly (``sys.platform == "wasi"``) it is the component's real imports
(:mod:`carteiro._host.wasm`); everywhere else the in-memory mock host
(:mod:`carteiro._host.mock`) that :mod:`carteiro.testing` drives. The generated bindings
are imported only in the first case, so the SDK imports cleanly in plain CPython.
"""

from __future__ import annotations

import sys

if sys.platform == "wasi":
    from carteiro._host import wasm as backend
else:
    from carteiro._host import mock as backend

__all__ = ["backend"]
