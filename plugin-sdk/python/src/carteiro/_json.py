"""Body JSON decoding whose errors use the Rust SDK's (serde_json's) words.

A dead-letter reason then reads the same whatever language a handler is written in, and
the operators' console groups them together. Only the error path does extra work.
"""

from __future__ import annotations

import json
import math
from typing import Any

from carteiro.errors import BodyError


class _OutOfRange(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    # Python accepts NaN and Infinity; JSON (and the Rust SDK) does not.
    raise ValueError(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: serde_json refuses it
        raise _OutOfRange(text)
    return value


def loads(body: bytes) -> Any:
    """Decodes ``body`` (UTF-8 JSON) or raises :class:`BodyError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"body is not UTF-8 (invalid byte at offset {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise BodyError(_describe(text, e), e.lineno, e.colno) from None
    except _OutOfRange as e:
        line, column = _position(text, text.find(str(e)))
        raise BodyError("number out of range", line, column) from None
    except ValueError as e:  # NaN / Infinity
        line, column = _position(text, text.find(str(e)))
        raise BodyError("expected value", line, column) from None
    except RecursionError:
        raise BodyError("recursion limit exceeded") from None


def _position(text: str, pos: int) -> tuple[int, int]:
    pos = max(pos, 0)
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _innermost(text: str, pos: int) -> str:
    """The innermost container open at ``pos``: ``"["``, ``"{"`` or ``""``."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append(ch)
        elif ch in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def _describe(text: str, e: json.JSONDecodeError) -> str:
    rest = text[e.pos :].lstrip(" \t\n\r")
    at_end = not rest
    container = _innermost(text, e.pos)
    eof = {"[": "EOF while parsing a list", "{": "EOF while parsing an object"}.get(
        container, "EOF while parsing a value"
    )
    msg = e.msg
    if msg.startswith("Expecting value"):
        if at_end:
            return "EOF while parsing a value"
        if rest[0] == "]" and text[: e.pos].rstrip().endswith(","):
            return "trailing comma"
        return "expected ident" if rest[0] in "tfn" else "expected value"
    if msg.startswith("Expecting property name"):
        if at_end:
            return eof
        if rest[0] == "}":
            return "trailing comma"
        return "key must be a string"
    if msg.startswith("Expecting ':'"):
        return eof if at_end else "expected `:`"
    if msg.startswith("Expecting ','"):
        if at_end:
            return eof
        return "expected `,` or `]`" if container == "[" else "expected `,` or `}`"
    if msg.startswith("Extra data"):
        return "trailing characters"
    if msg.startswith("Unterminated string"):
        return "EOF while parsing a string"
    if msg.startswith("Invalid control character"):
        return "control character (\\u0000-\\u001F) found while parsing a string"
    if msg.startswith("Invalid \\"):
        return "invalid escape"
    return msg[:1].lower() + msg[1:]
