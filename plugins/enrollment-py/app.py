"""The reference scenario in Python: a confirmed enrollment (``matricula.confirmada``).

Behaves exactly like the Rust plugin ``plugins/enrollment`` — same input, kv key and JSON
record, events, verdicts and reason texts:

Input: JSON ``{"matricula_id", "usuario_id", "curso_id"}`` (each a non-empty string or an
integer; a three-element array in that order is accepted too, as serde does).
Effects, committed together when the message acks:

- kv ``matricula/<matricula_id>`` = the record
  ``{"matricula_id":..,"usuario_id":..,"curso_id":..}``;
- three JSON events on the exchange in config var ``events_exchange`` (default
  ``carteiro.events``), each carrying the record and header ``x-causation-id`` = the
  incoming message id: ``acesso.liberado``, ``fatura.solicitada``, ``email.solicitado``.

Verdicts:

- invalid JSON or a missing/mistyped field → dead-letter, e.g.
  ``invalid matricula.confirmada: missing field `curso_id```;
- config var ``content_service`` = ``down`` → retry, "content service unavailable";
- kv unavailable → retry;
- the same enrollment already recorded → ack without new events (a business-level
  duplicate); recorded with other ids → dead-letter.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

import carteiro
from carteiro import CarteiroError, Message, Verdict, config, kv, outbox

DEFAULT_EVENTS_EXCHANGE = "carteiro.events"
ACESSO_LIBERADO = "acesso.liberado"
FATURA_SOLICITADA = "fatura.solicitada"
EMAIL_SOLICITADO = "email.solicitado"
ROUTING_KEYS = (ACESSO_LIBERADO, FATURA_SOLICITADA, EMAIL_SOLICITADO)
FIELDS = ("matricula_id", "usuario_id", "curso_id")

Id = str | int
Matricula = dict[str, Id]

log = logging.getLogger(__name__)

_ID_EXPECTED = "a non-empty string or an integer id"
_STRUCT_EXPECTED = "struct Matricula"


class Invalid(ValueError):
    """The payload is not a Matricula; the text is the Rust plugin's (serde's) wording."""


def _float_text(value: float) -> str:
    # serde prints floats like Python's repr, but without zero-padded exponents:
    # 1.5, 2.0, 1e+20, 1e-7.
    mantissa, e, exponent = repr(float(value)).partition("e")
    if not e:
        return mantissa
    sign = exponent[0] if exponent[0] in "+-" else ""
    return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"


def _unexpected(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{_float_text(value)}`"
    if isinstance(value, str):
        return f"string {json.dumps(value, ensure_ascii=False)}"
    return "sequence" if isinstance(value, list) else "map"


def _id(value: Any) -> Id:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, str):
        raise Invalid(f'invalid value: string "", expected {_ID_EXPECTED}')
    if isinstance(value, int) and not isinstance(value, bool):
        if -(2**63) <= value < 2**64:
            return value
        # Beyond i64/u64 serde_json reads the number as a float.
        value = float(Decimal(value))
    raise Invalid(f"invalid type: {_unexpected(value)}, expected {_ID_EXPECTED}")


def parse_matricula(value: Any) -> Matricula:
    """The Matricula in a decoded payload, or :class:`Invalid` saying what is wrong."""
    if isinstance(value, list):
        if len(value) < len(FIELDS):
            raise Invalid(
                f"invalid length {len(value)}, expected {_STRUCT_EXPECTED} with 3 elements"
            )
        if len(value) > len(FIELDS):
            raise Invalid("trailing characters")
        return {name: _id(v) for name, v in zip(FIELDS, value, strict=True)}
    if not isinstance(value, dict):
        raise Invalid(f"invalid type: {_unexpected(value)}, expected {_STRUCT_EXPECTED}")
    found = {name: _id(v) for name, v in value.items() if name in FIELDS}
    for name in FIELDS:
        if name not in found:
            raise Invalid(f"missing field `{name}`")
    return {name: found[name] for name in FIELDS}


@carteiro.handler
def handle(msg: Message) -> Verdict:
    try:
        return confirm(msg)
    except CarteiroError as e:  # kv unavailable -> retry; bad key/event -> dead-letter
        return e.to_verdict()


def confirm(msg: Message) -> Verdict:
    try:
        matricula = parse_matricula(msg.json())
    except carteiro.BodyError as e:
        return Verdict.dead_letter(f"invalid matricula.confirmada: {e.description}")
    except Invalid as e:
        return Verdict.dead_letter(f"invalid matricula.confirmada: {e}")

    if config.get("content_service") == "down":
        return Verdict.retry("content service unavailable")

    matricula_id = matricula["matricula_id"]
    key = f"matricula/{matricula_id}"
    stored = kv.get_json(key)
    if stored is not None:
        try:
            existing = parse_matricula(stored)
        except Invalid as e:
            return Verdict.dead_letter(f"kv: value of `{key}` is not the expected JSON: {e}")
        if existing == matricula and _same_types(existing, matricula):
            log.info("matricula %s already confirmed; nothing to do", matricula_id)
            return Verdict.ack()
        return Verdict.dead_letter(
            f"matricula {matricula_id} was already confirmed "
            "with a different usuario_id or curso_id"
        )
    kv.set_json(key, matricula)

    exchange = config.get("events_exchange", DEFAULT_EVENTS_EXCHANGE)
    headers = [("x-causation-id", msg.id)] if msg.id is not None else None
    for routing_key in ROUTING_KEYS:
        outbox.emit_json(exchange, routing_key, matricula, headers=headers)
    log.info("matricula %s confirmed", matricula_id)
    return Verdict.ack()


def _same_types(a: Matricula, b: Matricula) -> bool:
    # "7" and 7 are different ids, as in the Rust plugin.
    return all(type(a[name]) is type(b[name]) for name in FIELDS)
