"""The limits and checks the Carteiro host applies to every kv key and outbox event.

A port of the Rust SDK's ``carteiro_sdk::rules`` (the very module the gateway uses), so
that the mock host of :mod:`carteiro.testing` refuses exactly what production refuses,
with the same words. Lengths are in UTF-8 bytes, as on the host.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Longest kv key, in bytes.
MAX_KV_KEY_BYTES = 1024
#: Largest kv value, in bytes.
MAX_KV_VALUE_BYTES = 4 << 20
#: Largest outbox event payload, in bytes.
MAX_EVENT_PAYLOAD_BYTES = 8 << 20
#: AMQP short strings (exchange, routing key, header names) hold at most 255 bytes.
MAX_SHORT_STRING = 255


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def kv_key_problem(key: str, max_len: int = MAX_KV_KEY_BYTES) -> str | None:
    """Why ``key`` cannot be a kv key when keys may be ``max_len`` bytes long, or ``None``."""
    if not key:
        return "kv keys must not be empty"
    length = _utf8_len(key)
    if length > max_len:
        return f"kv key is {length} bytes; at most {max_len}"
    if "\0" in key:
        return "kv keys must not contain NUL"
    return None


def event_problem(
    exchange: str, routing_key: str, headers: Iterable[tuple[str, str]] = ()
) -> str | None:
    """Why an event with this exchange, routing key and headers cannot be published.

    ``None`` if it can. The payload's size is checked on its own.
    """
    for what, text in (("exchange", exchange), ("routing key", routing_key)):
        length = _utf8_len(text)
        if length > MAX_SHORT_STRING:
            return f"{what} is {length} bytes; AMQP allows {MAX_SHORT_STRING}"
        if "\0" in text:
            return f"{what} must not contain NUL"
    for name, value in headers:
        if not name or _utf8_len(name) > MAX_SHORT_STRING:
            return f"header names must be 1-{MAX_SHORT_STRING} bytes"
        if "\0" in name or "\0" in value:
            shown = name.replace("\0", "\\0")
            return f"header `{shown}` must not contain NUL"
    return None
