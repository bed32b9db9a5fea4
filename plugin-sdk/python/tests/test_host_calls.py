import json
import logging

import pytest

import carteiro
from carteiro import (
    InvalidEvent,
    InvalidKey,
    InvalidValue,
    Message,
    PayloadTooLarge,
    StoreUnavailable,
    ValueTooLarge,
    Verdict,
    config,
    kv,
    outbox,
)
from carteiro.testing import HostCallLimitExceeded, Limits, MockHost


def test_kv_round_trips(mock_host: MockHost) -> None:
    assert kv.get("k") is None
    kv.set("k", "välue")
    assert kv.get("k") == "välue".encode()
    assert kv.get_text("k") == "välue"
    assert kv.contains("k")
    kv.set_json("doc", {"a": [1, 2], "b": "ç"})
    assert mock_host.kv("doc") == '{"a":[1,2],"b":"ç"}'.encode()
    assert kv.get_json("doc") == {"a": [1, 2], "b": "ç"}
    assert kv.get_json("missing") is None
    kv.delete("k")
    kv.delete("never-there")
    assert not kv.contains("k")


def test_incr_stores_decimal_text(mock_host: MockHost) -> None:
    assert kv.incr("n") == 1
    assert kv.incr("n", 41) == 42
    assert mock_host.kv("n") == b"42"
    mock_host.kv_insert("m", " -7 ")
    assert kv.incr("m", 2) == -5
    for bad in ("x", "1_000", "1.5", ""):
        mock_host.kv_insert("bad", bad)
        with pytest.raises(InvalidValue, match="is not an integer"):
            kv.incr("bad")
    mock_host.kv_insert("big", str(2**63 - 1))
    with pytest.raises(InvalidValue, match="overflows i64"):
        kv.incr("big")


def test_kv_codec_errors(mock_host: MockHost) -> None:
    mock_host.kv_insert("bin", b"\xff")
    with pytest.raises(InvalidValue, match="not UTF-8"):
        kv.get_text("bin")
    with pytest.raises(InvalidValue, match="not the expected JSON"):
        kv.get_json("bin")


def test_invalid_keys_and_limits(mock_host: MockHost) -> None:
    with pytest.raises(InvalidKey) as e:
        kv.set("", "v")
    assert str(e.value) == "kv: invalid key: kv keys must not be empty"
    with pytest.raises(InvalidKey, match="NUL"):
        kv.get("a\0b")
    with pytest.raises(InvalidKey, match="1025 bytes; at most 1024"):
        kv.get("k" * 1025)
    with pytest.raises(InvalidKey, match="1026 bytes"):
        kv.get("é" * 513)  # length counts UTF-8 bytes, as on the host
    mock_host.limits = Limits(max_value_len=3)
    with pytest.raises(ValueTooLarge) as too_large:
        kv.set("k", "long")
    assert too_large.value.limit == 3
    assert too_large.value.to_verdict() == Verdict.dead_letter(
        "kv: value larger than the 3-byte limit"
    )


def test_unavailable_store_fails_reads_only(mock_host: MockHost) -> None:
    mock_host.set_kv_unavailable("db down")
    kv.set("k", "v")
    with pytest.raises(StoreUnavailable) as e:
        kv.get("k")
    assert e.value.transient
    assert e.value.to_verdict() == Verdict.retry("kv unavailable: db down")
    assert isinstance(e.value, carteiro.KvError)
    mock_host.set_kv_unavailable(None)
    assert kv.get("k") == b"v"


def test_outbox_events_and_rules(mock_host: MockHost) -> None:
    event_id = outbox.emit_json("ex", "rk", {"n": 1}, headers={"x-a": "1"})
    assert event_id.startswith("00000000-0000-7000-8000-")
    outbox.emit("ex", "raw", b"\x00\x01", content_type="application/octet-stream")
    first, second = mock_host.events()
    assert (first.exchange, first.routing_key, first.content_type) == (
        "ex",
        "rk",
        "application/json",
    )
    assert first.payload == b'{"n":1}' and first.json() == {"n": 1}
    assert first.header("x-a") == "1"
    assert second.payload == b"\x00\x01" and second.id != first.id
    with pytest.raises(InvalidEvent, match="routing key must not contain NUL"):
        outbox.emit("ex", "bad\0key", "")
    with pytest.raises(InvalidEvent, match="exchange is 256 bytes; AMQP allows 255"):
        outbox.emit("x" * 256, "rk", "")
    with pytest.raises(InvalidEvent, match="header names must be 1-255 bytes"):
        outbox.emit("ex", "rk", "", headers=[("", "v")])
    with pytest.raises(InvalidEvent, match=r"header `h\\0` must not contain NUL"):
        outbox.emit("ex", "rk", "", headers=[("h\0", "v")])
    with pytest.raises(TypeError):
        outbox.emit_json("ex", "rk", object())
    mock_host.limits = Limits(max_payload_len=2)
    with pytest.raises(PayloadTooLarge) as e:
        outbox.emit("ex", "rk", "abc")
    assert str(e.value) == "outbox: payload larger than the 2-byte limit"


def test_config(mock_host: MockHost) -> None:
    mock_host.set_var("b", "2")
    mock_host.set_var("a", "1")
    assert config.get("a") == "1"
    assert config.get("zzz") is None
    assert config.get("zzz", "dflt") == "dflt"
    assert list(config.all().items()) == [("a", "1"), ("b", "2")]
    mock_host.remove_var("a")
    assert config.get("a") is None


def counting(msg: Message) -> Verdict:
    n = kv.incr("runs")
    outbox.emit_json(config.get("out_exchange", "carteiro.events"), "counted", {"n": n})
    logging.getLogger("counting").info("counted %d", n)
    verdict = msg.header("verdict")
    if verdict == "retry":
        return Verdict.retry("asked to")
    if verdict == "dead":
        return Verdict.dead_letter("asked to")
    return Verdict.ack()


def test_ack_commits_kv_events_and_captures_logs(mock_host: MockHost) -> None:
    mock_host.set_var("out_exchange", "ex")
    out = mock_host.run(counting, Message(routing_key="k", body=b"x"))
    assert out.verdict.is_ack
    assert out.kv_writes == {"runs": b"1"}
    assert [(e.exchange, e.routing_key, e.json()) for e in out.events] == [
        ("ex", "counted", {"n": 1})
    ]
    assert [(r.level, r.message) for r in out.logs] == [("info", "counted 1")]
    assert len(mock_host.events()) == 1
    assert mock_host.kv_text("runs") == "1"
    assert out.events_to("counted") == out.events and out.events_to("other") == []


def test_retry_and_dead_letter_discard_effects(mock_host: MockHost) -> None:
    mock_host.run(counting, Message())
    for verdict in ("retry", "dead"):
        out = mock_host.run(counting, Message(headers={"verdict": verdict}))
        assert not out.verdict.is_ack
        assert len(out.events) == 1, "the run still reports what it tried"
        assert mock_host.kv_text("runs") == "1"
        assert len(mock_host.events()) == 1


def test_an_exception_propagates_and_discards_effects(mock_host: MockHost) -> None:
    def boom(msg: Message) -> Verdict:
        kv.set("k", "v")
        raise KeyError("curso_id")

    with pytest.raises(KeyError):
        mock_host.run(boom, Message())
    assert mock_host.kv_entries() == {}


def test_a_non_verdict_return_is_a_type_error(mock_host: MockHost) -> None:
    def forgetful(msg: Message) -> Verdict:
        kv.set("k", "v")
        return None  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a carteiro.Verdict"):
        mock_host.run(forgetful, Message())
    assert mock_host.kv_entries() == {}


def test_host_call_cap_cannot_be_swallowed(mock_host: MockHost) -> None:
    mock_host.limits = Limits(max_host_calls=3)

    def flood(msg: Message) -> Verdict:
        while True:
            try:
                kv.get("k")
            except Exception:  # a real trap cannot be caught either
                pass

    with pytest.raises(HostCallLimitExceeded, match="exceeded 3 host calls"):
        mock_host.run(flood, Message())
    # Outside run() nothing is counted.
    for i in range(5):
        kv.set(f"seed/{i}", "x")


def test_kv_writes_report_deletes(mock_host: MockHost) -> None:
    mock_host.kv_insert("old", "1")

    def rewrite(msg: Message) -> Verdict:
        kv.delete("old")
        kv.set("new", "2")
        return Verdict.ack()

    out = mock_host.run(rewrite, Message())
    assert out.kv_writes == {"new": b"2", "old": None}
    assert mock_host.kv_entries() == {"new": b"2"}


def test_log_levels(mock_host: MockHost) -> None:
    def chatty(msg: Message) -> Verdict:
        log = logging.getLogger("chatty")
        log.log(5, "t")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        log.critical("c")
        try:
            raise ValueError("inner")
        except ValueError:
            log.exception("failed")
        return Verdict.ack()

    logs = mock_host.run(chatty, Message()).logs
    assert [r.level for r in logs] == ["trace", "debug", "info", "warn", "error", "error", "error"]
    assert logs[-1].message.startswith("failed\nTraceback")
    assert "ValueError: inner" in logs[-1].message
    assert json.dumps([r.message for r in logs[:6]]) == '["t", "d", "i", "w", "e", "c"]'
