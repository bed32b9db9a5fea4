import pytest

import carteiro
from carteiro import Batch, Message, Verdict, kv, outbox
from carteiro.testing import MockHost


def handle_one(msg: Message) -> Verdict:
    seen = kv.get("count")
    kv.set("count", b"1" if seen is None else b"2")
    outbox.emit("ex", msg.routing_key, msg.body)
    if msg.text() == "retry":
        return Verdict.retry(f"asked (count read {seen!r})")
    if msg.text() == "dead":
        return Verdict.dead_letter("asked")
    return Verdict.ack()


@carteiro.batch_handler
def handle(batch: Batch) -> list[Verdict]:
    return [handle_one(msg) for msg in batch]


def test_each_message_commits_only_its_own_effects(mock_host: MockHost) -> None:
    messages = [
        Message.from_text("a", "ok"),
        Message.from_text("b", "retry"),
        Message.from_text("c", "dead"),
        Message.from_text("d", "ok"),
    ]
    outcomes = mock_host.run_batch(handle, messages)
    assert [o.verdict.kind for o in outcomes] == ["ack", "retry", "dead_letter", "ack"]
    # Message b read the committed store, not a's uncommitted write.
    assert outcomes[1].verdict == Verdict.retry("asked (count read None)")
    assert all(len(o.events) == 1 and o.kv_writes == {"count": b"1"} for o in outcomes)
    assert [e.routing_key for e in mock_host.events()] == ["a", "d"]
    assert mock_host.kv_text("count") == "1"


def test_a_wrong_number_of_verdicts_retries_every_message(mock_host: MockHost) -> None:
    def short(batch: Batch) -> list[Verdict]:
        for _ in batch:
            kv.set("k", b"v")
        return [Verdict.ack()]

    outcomes = mock_host.run_batch(short, [Message.from_text("a", "1"), Message.from_text("b", "2")])
    assert all(o.verdict.kind == "retry" for o in outcomes)
    assert mock_host.kv("k") is None


def test_an_index_past_the_batch_fails_like_a_trap(mock_host: MockHost) -> None:
    def past(batch: Batch) -> list[Verdict]:
        from carteiro._host import backend

        backend.batch_item(len(batch))
        return [Verdict.ack() for _ in batch]

    with pytest.raises(RuntimeError, match="batch item 1 in a batch of 1"):
        mock_host.run_batch(past, [Message.from_text("a", "1")])


def test_decorator_checks_the_signature() -> None:
    with pytest.raises(TypeError, match="exactly one argument"):

        @carteiro.batch_handler
        def two(batch: Batch, extra: int) -> list[Verdict]:
            return []
