from datetime import timedelta

import pytest

from carteiro import BodyError, Header, Message, Verdict


def test_message_defaults_and_builders() -> None:
    msg = Message.from_json("order.created", {"id": 1, "name": "é"}, id="m-1", headers={"x-t": "a"})
    assert msg.routing_key == "order.created"
    assert msg.body == '{"id":1,"name":"é"}'.encode()
    assert msg.content_type == "application/json"
    assert (msg.id, msg.exchange, msg.attempt, msg.redelivered) == ("m-1", "", 1, False)
    assert msg.headers == (Header("x-t", "a"),)
    assert Message.from_text("k", "hi").body == b"hi"
    assert Message(body="text").body == b"text"


def test_header_is_first_exact_match() -> None:
    msg = Message(headers=[("x-tenant", "acme"), ("x-tenant", "other")])
    assert msg.header("x-tenant") == "acme"
    assert msg.header("X-Tenant") is None


def test_text_rejects_non_utf8() -> None:
    assert Message(body=b"hello").text() == "hello"
    with pytest.raises(BodyError) as e:
        Message(body=b"a\xff").text()
    assert str(e.value) == "body is not UTF-8 (invalid byte at offset 1)"


@pytest.mark.parametrize(
    ("body", "description"),
    [
        (b"{oops", "key must be a string"),
        (b"{", "EOF while parsing an object"),
        (b"", "EOF while parsing a value"),
        (b"[1 2]", "expected `,` or `]`"),
        (b'{"a":1 "b":2}', "expected `,` or `}`"),
        (b'{"a" 1}', "expected `:`"),
        (b'{"a":1,}', "trailing comma"),
        (b"1 2", "trailing characters"),
        (b'"abc', "EOF while parsing a string"),
        (b"NaN", "expected value"),
        (b"hello", "expected value"),
        (b"[1E400]", "number out of range"),
    ],
)
def test_json_errors_use_the_rust_sdk_words(body: bytes, description: str) -> None:
    with pytest.raises(BodyError) as e:
        Message(body=body).json()
    assert e.value.description == description
    assert e.value.is_syntax
    assert e.value.to_verdict() == Verdict.dead_letter(f"invalid body: {e.value}")


def test_json_error_has_a_position() -> None:
    with pytest.raises(BodyError) as e:
        Message(body=b'{\n  "a": }').json()
    assert (e.value.line, e.value.column) == (2, 8)
    assert str(e.value) == "expected value at line 2 column 8"


def test_deep_json_is_a_body_error_not_a_crash() -> None:
    with pytest.raises(BodyError) as e:
        Message(body=b"[" * 100_000).json()
    assert e.value.description in {"recursion limit exceeded", "EOF while parsing a value"}


def test_verdicts() -> None:
    assert Verdict.ack().is_ack and Verdict.ack().reason is None
    assert Verdict.dead_letter("bad") == Verdict("dead_letter", "bad")
    assert Verdict.retry("later").delay_ms is None
    assert Verdict.retry("later", delay=1.5).delay_ms == 1500
    assert Verdict.retry("later", delay=timedelta(minutes=1)).delay == timedelta(seconds=60)
    assert Verdict.retry("later", delay=0.0001).delay_ms == 1  # "at least": rounded up
    assert repr(Verdict.retry("x", delay=2)) == "Verdict.retry('x', delay=2.0)"
    with pytest.raises(ValueError):
        Verdict.retry("x", delay=-1)
    with pytest.raises(ValueError):
        Verdict.retry("x", delay=float("inf"))
