"""Key-value state, namespaced per plugin, read and written inside the message's transaction.

Writes become visible to other messages only if this message acks; a retry or dead-letter
verdict discards them. Isolation is serializable per key: the host may re-run the handler
when a concurrent message wrote a key this one read, so a handler must be deterministic
given its message, kv reads and config.

Every function raises :class:`~carteiro.KvError` (``InvalidKey``, ``ValueTooLarge``,
``StoreUnavailable``, or the SDK-side ``InvalidValue``).
"""

from __future__ import annotations

import json as _json
import re
from typing import Any

from carteiro._host import backend
from carteiro.errors import InvalidValue

__all__ = ["get", "get_text", "get_json", "set", "set_json", "delete", "contains", "incr"]

Value = bytes | bytearray | memoryview | str

_INTEGER = re.compile(r"[+-]?[0-9]+")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _bytes(value: Value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def get(key: str) -> bytes | None:
    """The value stored under ``key``, or ``None``."""
    return backend.kv_get(key)


def set(key: str, value: Value) -> None:  # noqa: A001 - the verb of the WIT interface
    """Stores ``value`` (bytes, or text as UTF-8) under ``key``; committed if the message acks."""
    backend.kv_set(key, _bytes(value))


def delete(key: str) -> None:
    """Deletes ``key``; deleting a missing key is not an error."""
    backend.kv_delete(key)


def contains(key: str) -> bool:
    """True when ``key`` holds a value."""
    return get(key) is not None


def get_text(key: str) -> str | None:
    """The value under ``key`` decoded as UTF-8 text."""
    raw = get(key)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidValue(f"value of `{key}` is not UTF-8") from None


def get_json(key: str) -> Any:
    """The value under ``key`` decoded from JSON (``None`` when missing)."""
    raw = get(key)
    if raw is None:
        return None
    try:
        return _json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidValue(f"value of `{key}` is not the expected JSON: {e}") from None


def set_json(key: str, value: Any) -> None:
    """Stores ``value`` under ``key`` as compact JSON (as the Rust SDK writes it)."""
    set(key, _json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def incr(key: str, by: int = 1) -> int:
    """Adds ``by`` to the integer under ``key`` (missing counts as 0); returns the new value.

    The counter is stored as decimal text (``"42"``) so other tools — and handlers in other
    languages — can read it; like the Rust SDK it is a signed 64-bit integer.
    """
    raw = get(key)
    current = 0
    if raw is not None:
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = ""
        if not _INTEGER.fullmatch(text):
            raise InvalidValue(f"value of `{key}` is not an integer")
        current = int(text)
    result = current + int(by)
    if not _I64_MIN <= result <= _I64_MAX:
        raise InvalidValue(f"counter `{key}` overflows i64")
    set(key, str(result))
    return result
