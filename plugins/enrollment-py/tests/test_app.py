"""Mirrors plugins/enrollment's tests (and pins the reason texts they share)."""

from __future__ import annotations

import pytest

from carteiro import Message, Verdict
from carteiro.testing import MockHost

import app
from app import ACESSO_LIBERADO, EMAIL_SOLICITADO, FATURA_SOLICITADA, handle


def confirmada(body: object) -> Message:
    return Message.from_json("matricula.confirmada", body, id="msg-1")


def test_records_and_emits_three_events(mock_host: MockHost) -> None:
    mock_host.set_var("events_exchange", "escola.eventos")
    body = {"matricula_id": "m-1", "usuario_id": 7, "curso_id": "rust-101"}
    out = mock_host.run(handle, confirmada(body))
    assert out.verdict == Verdict.ack()
    assert [e.routing_key for e in out.events] == [
        ACESSO_LIBERADO,
        FATURA_SOLICITADA,
        EMAIL_SOLICITADO,
    ]
    for e in out.events:
        assert e.exchange == "escola.eventos"
        assert e.content_type == "application/json"
        assert e.json() == body
        assert e.headers == (("x-causation-id", "msg-1"),)
    # Byte for byte what the Rust plugin stores: fields in declaration order, compact JSON.
    assert (
        mock_host.kv("matricula/m-1")
        == b'{"matricula_id":"m-1","usuario_id":7,"curso_id":"rust-101"}'
    )
    assert out.events[0].payload == mock_host.kv("matricula/m-1")
    assert len(mock_host.events()) == 3
    assert [(r.level, r.message) for r in out.logs] == [("info", "matricula m-1 confirmed")]


def test_default_exchange_and_no_causation_header_without_an_id(mock_host: MockHost) -> None:
    msg = Message.from_json(
        "matricula.confirmada", {"curso_id": 3, "usuario_id": 2, "matricula_id": 1}
    )
    out = mock_host.run(handle, msg)
    assert out.verdict.is_ack
    assert {e.exchange for e in out.events} == {"carteiro.events"}
    assert all(e.headers == () for e in out.events)
    assert mock_host.kv("matricula/1") == b'{"matricula_id":1,"usuario_id":2,"curso_id":3}'


def test_malformed_payloads_dead_letter_naming_the_problem(mock_host: MockHost) -> None:
    out = mock_host.run(handle, confirmada({"matricula_id": "m-1", "usuario_id": "u-1"}))
    assert out.verdict == Verdict.dead_letter(
        "invalid matricula.confirmada: missing field `curso_id`"
    )
    out = mock_host.run(handle, Message.from_text("matricula.confirmada", "{oops"))
    assert out.verdict.is_dead_letter
    assert (out.verdict.reason or "").startswith(
        "invalid matricula.confirmada: key must be a string"
    )
    out = mock_host.run(handle, confirmada({"matricula_id": True, "usuario_id": 1, "curso_id": 2}))
    assert out.verdict.is_dead_letter
    assert mock_host.kv_entries() == {}
    assert mock_host.events() == []


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            {"matricula_id": True, "usuario_id": 1, "curso_id": 2},
            "invalid type: boolean `true`, expected a non-empty string or an integer id",
        ),
        (
            {"matricula_id": "", "usuario_id": 1, "curso_id": 2},
            'invalid value: string "", expected a non-empty string or an integer id',
        ),
        (
            {"matricula_id": 1.5, "usuario_id": 1, "curso_id": 2},
            "invalid type: floating point `1.5`, expected a non-empty string or an integer id",
        ),
        (
            {"matricula_id": None, "usuario_id": 1, "curso_id": 2},
            "invalid type: null, expected a non-empty string or an integer id",
        ),
        (
            {"matricula_id": [1], "usuario_id": 1, "curso_id": 2},
            "invalid type: sequence, expected a non-empty string or an integer id",
        ),
        (
            {"matricula_id": {}, "usuario_id": 1, "curso_id": 2},
            "invalid type: map, expected a non-empty string or an integer id",
        ),
        ({"usuario_id": 1}, "missing field `matricula_id`"),
        ("text", 'invalid type: string "text", expected struct Matricula'),
        (5, "invalid type: integer `5`, expected struct Matricula"),
        (None, "invalid type: null, expected struct Matricula"),
        ([1, 2], "invalid length 2, expected struct Matricula with 3 elements"),
    ],
)
def test_reason_texts_match_the_rust_plugin(
    mock_host: MockHost, body: object, problem: str
) -> None:
    out = mock_host.run(handle, confirmada(body))
    assert out.verdict == Verdict.dead_letter(f"invalid matricula.confirmada: {problem}")


def test_a_three_element_array_is_a_matricula_as_in_serde(mock_host: MockHost) -> None:
    assert mock_host.run(handle, confirmada(["m-9", 1, 2])).verdict.is_ack
    assert mock_host.kv_json("matricula/m-9") == {
        "matricula_id": "m-9",
        "usuario_id": 1,
        "curso_id": 2,
    }


def test_float_texts_follow_serde_json() -> None:
    # What the Rust plugin answers for these numbers (checked with `carteiro plugin test`).
    assert app._float_text(2.0) == "2.0"
    assert app._float_text(1e20) == "1e+20"
    assert app._float_text(1e-7) == "1e-7"
    assert app._float_text(1e15) == "1000000000000000.0"
    assert app._float_text(-0.0) == "-0.0"
    assert app._float_text(1.8446744073709552e19) == "1.8446744073709552e+19"


@pytest.mark.parametrize(
    ("number", "shown"),
    [("1e20", "1e+20"), ("0.0000001", "1e-7"), ("18446744073709551616", "1.8446744073709552e+19")],
)
def test_big_and_small_numbers_read_as_serde_reads_them(
    mock_host: MockHost, number: str, shown: str
) -> None:
    body = f'{{"matricula_id":{number},"usuario_id":1,"curso_id":2}}'
    out = mock_host.run(handle, Message.from_text("matricula.confirmada", body))
    assert out.verdict == Verdict.dead_letter(
        f"invalid matricula.confirmada: invalid type: floating point `{shown}`, "
        "expected a non-empty string or an integer id"
    )


def test_a_number_out_of_range_is_a_body_error(mock_host: MockHost) -> None:
    body = '{"matricula_id":1E400,"usuario_id":1,"curso_id":2}'
    out = mock_host.run(handle, Message.from_text("matricula.confirmada", body))
    assert out.verdict == Verdict.dead_letter("invalid matricula.confirmada: number out of range")


def test_content_service_down_retries_without_effects(mock_host: MockHost) -> None:
    mock_host.set_var("content_service", "down")
    body = {"matricula_id": 1, "usuario_id": 2, "curso_id": 3}
    out = mock_host.run(handle, confirmada(body))
    assert out.verdict == Verdict.retry("content service unavailable")
    assert mock_host.kv_entries() == {}
    mock_host.set_var("content_service", "up")
    assert mock_host.run(handle, confirmada(body)).verdict.is_ack


def test_kv_outage_retries(mock_host: MockHost) -> None:
    mock_host.set_kv_unavailable("database down")
    out = mock_host.run(handle, confirmada({"matricula_id": 1, "usuario_id": 2, "curso_id": 3}))
    assert out.verdict == Verdict.retry("kv unavailable: database down")
    assert mock_host.events() == []


def test_duplicate_enrollment_acks_without_new_events(mock_host: MockHost) -> None:
    body = {"matricula_id": 1, "usuario_id": 2, "curso_id": 3}
    assert mock_host.run(handle, confirmada(body)).verdict.is_ack
    again = mock_host.run(handle, confirmada(body))
    assert again.verdict.is_ack
    assert again.events == []
    assert [r.message for r in again.logs] == ["matricula 1 already confirmed; nothing to do"]
    conflicting = {"matricula_id": 1, "usuario_id": 9, "curso_id": 3}
    out = mock_host.run(handle, confirmada(conflicting))
    assert out.verdict == Verdict.dead_letter(
        "matricula 1 was already confirmed with a different usuario_id or curso_id"
    )
    # "2" is not the id 2.
    as_text = {"matricula_id": 1, "usuario_id": "2", "curso_id": 3}
    assert mock_host.run(handle, confirmada(as_text)).verdict.is_dead_letter
    assert len(mock_host.events()) == 3


def test_a_corrupt_stored_record_dead_letters(mock_host: MockHost) -> None:
    mock_host.kv_insert("matricula/1", "not json")
    out = mock_host.run(handle, confirmada({"matricula_id": 1, "usuario_id": 2, "curso_id": 3}))
    assert out.verdict.is_dead_letter
    assert (out.verdict.reason or "").startswith(
        "kv: value of `matricula/1` is not the expected JSON"
    )
