"""The story's aio-pika consumer, its dead letters archived by Carteiro (issue 37, "Must show").
Each test declares its own queues (the story's names, or with a prefix of its own)."""

import json
import time
import uuid

from conftest import delete_story, publish, queue_depth, story_consumer, wait_for

# Exactly as the docs (docs/dead-letters.md) and the issue write it.
STORY_CONFIG = """
[[dead_letter_queues]]
queue = "matriculas.dlq"      # an existing queue that other services dead-letter into
# route = "matriculas"        # the name it has in the console and in `dlq --route` (default: the queue)
# alert = { count = 10, window = "1h" }
"""


def test_a_malformed_event_is_archived_with_its_x_death_reason_searchable_and_replayed_once(
        tmp_path, running):
    carteiro, service = running
    delete_story("matriculas")
    consumer, processed = story_consumer(service, tmp_path, "matriculas")
    c = carteiro(STORY_CONFIG)
    assert "matriculas.dlq: exists" in c.cli("check").stdout
    c.start()
    publish("matriculas.processar", json.dumps({"matricula_id": 7}).encode(), "ok-7")
    publish("matriculas.processar", json.dumps({"matricula": 42}).encode(), "malformed-42")
    rows = wait_for("the malformed event in the archive", lambda: c.dead_letters("--route", "matriculas.dlq"))
    assert len(rows) == 1, rows
    d = rows[0]
    assert d["message_id"] == "malformed-42"
    assert d["reason"] == "rejected in queue matriculas.processar"
    assert d["queue"] == "matriculas.processar"
    shown = c.show(d["id"])
    headers = dict(shown["headers"])
    death = json.loads(headers["x-death"])[0]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", "matriculas.processar", 1)
    assert death["routing-keys"] == ["matriculas.processar"]
    assert json.loads(shown["body"]) == {"matricula": 42}
    assert queue_depth("matriculas.dlq") == 0, "acked once archived"
    page = c.console_page(d["id"], screenshot="foreign-dead-letter")
    for shown in ("malformed-42", "rejected in queue", "Replays to", "queue `matriculas.processar`"):
        assert shown in page.replace("&#96;", "`"), shown
    # Searchable by its message id and by a field of its body.
    assert [r["id"] for r in c.dead_letters("--search", "id:malformed-42")] == [d["id"]]
    assert [r["id"] for r in c.dead_letters("--search", "body.matricula = 42")] == [d["id"]]
    assert c.dead_letters("--search", "body.matricula = 43") == []

    # The fix, then one replay: the consumer sees it once, with its message id.
    consumer.stop()
    fixed, processed_fixed = story_consumer(service, tmp_path, "matriculas", fixed=True)
    out = c.cli("dlq", "replay", "--route", "matriculas.dlq", "--reason", "rejected").stdout
    assert "1 replayed" in out, out
    wait_for("the replayed event at the fixed consumer",
             lambda: "malformed-42 42" in processed_fixed.read_text())
    time.sleep(2)  # long enough for a second copy to arrive, were one sent
    assert processed_fixed.read_text().splitlines() == ["malformed-42 42"]
    assert len(c.dead_letters("--route", "matriculas.dlq")) == 1
    assert "0 replayed" in c.cli("dlq", "replay", "--route", "matriculas.dlq").stdout


def test_the_alert_rises_on_the_count(tmp_path, running):
    carteiro, service = running
    prefix = f"alerta-{uuid.uuid4().hex[:6]}"
    delete_story(prefix)
    story_consumer(service, tmp_path, prefix)
    c = carteiro(f"""
[[dead_letter_queues]]
queue = "{prefix}.dlq"
route = "matriculas"
alert = {{ count = 3, window = "1h" }}
""").start()
    gauge = 'carteiro_dead_letter_alert_active{route="matriculas"}'
    wait_for("the alert gauge at 0", lambda: f"{gauge} 0" in (c.get("/metrics") or ""))
    for i in range(2):
        publish(f"{prefix}.processar", b"{}", f"bad-{i}")
    wait_for("two archived", lambda: len(c.dead_letters("--route", "matriculas")) == 2)
    time.sleep(1)
    assert f"{gauge} 0" in c.get("/metrics"), "two is under the count"
    publish(f"{prefix}.processar", b"{}", "bad-2")
    wait_for("the alert raised", lambda: f"{gauge} 1" in (c.get("/metrics") or ""))
    assert "matriculas" in c.get("/readyz")


def test_a_sigkill_while_archiving_loses_nothing_and_stores_nothing_twice(tmp_path, running):
    carteiro, service = running
    prefix = f"kill-{uuid.uuid4().hex[:6]}"
    delete_story(prefix)
    consumer, _ = story_consumer(service, tmp_path, prefix)
    total = 300
    for i in range(total):
        publish(f"{prefix}.processar", b"not json", f"m-{i}")
    wait_for("every event dead-lettered", lambda: queue_depth(f"{prefix}.dlq") == total)
    c = carteiro(f'[[dead_letter_queues]]\nqueue = "{prefix}.dlq"\n')
    # Killed between a row's commit and its ack: its redelivery must not be a second row.
    c.start(fault="dlq-hang-after-commit")
    wait_for("the hang after the first commit", lambda: "fault injection" in c.log.read_text())
    assert len(c.dead_letters()) == 1
    c.kill()
    # Then killed at a moment of its own while archiving.
    c.start()
    wait_for("some archived", lambda: len(c.dead_letters()) >= 20, every=0.05)
    c.kill()
    archived_at_kill = len(c.dead_letters())
    c.start()
    # Ready messages only: those held unacked are not counted, so wait for the archive too.
    wait_for("the DLQ drained", lambda: queue_depth(f"{prefix}.dlq") == 0)
    wait_for(f"{total} archived", lambda: len(c.dead_letters()) >= total)
    time.sleep(1)
    rows = c.dead_letters()
    ids = sorted(r["message_id"] for r in rows)
    assert ids == sorted(f"m-{i}" for i in range(total)), \
        f"{len(rows)} rows, {len(set(ids))} distinct, {archived_at_kill} at the kill"


def test_a_quorum_dlq_works(tmp_path, running):
    carteiro, service = running
    prefix = f"quorum-{uuid.uuid4().hex[:6]}"
    delete_story(prefix)
    consumer, processed = story_consumer(service, tmp_path, prefix, queue_type="quorum")
    c = carteiro(f'[[dead_letter_queues]]\nqueue = "{prefix}.dlq"\n').start()
    publish(f"{prefix}.processar", b'{"matricula": 9}', "q-9")
    rows = wait_for("the quorum dead letter archived", lambda: c.dead_letters())
    assert rows[0]["reason"] == f"rejected in queue {prefix}.processar"
    assert queue_depth(f"{prefix}.dlq") == 0
    consumer.stop()
    _, processed = story_consumer(service, tmp_path, prefix, fixed=True, queue_type="quorum")
    assert "1 replayed" in c.cli("dlq", "replay", str(rows[0]["id"])).stdout
    wait_for("the replay at the fixed consumer", lambda: "q-9 9" in processed.read_text())


def test_a_missing_queue_is_named_at_start(tmp_path, running):
    carteiro, _ = running
    c = carteiro('[[dead_letter_queues]]\nqueue = "no-such-queue.dlq"\n')
    checked = c.cli("check", check=False)
    assert checked.returncode != 0 and "no-such-queue.dlq" in checked.stderr, checked
    done = c.cli("run", check=False)
    assert done.returncode != 0
    assert "no-such-queue.dlq" in done.stderr + done.stdout


def test_edit_and_retry_sends_the_edited_copy_back_to_the_consumer(tmp_path, running):
    carteiro, service = running
    prefix = f"edit-{uuid.uuid4().hex[:6]}"
    delete_story(prefix)
    _, processed = story_consumer(service, tmp_path, prefix)
    c = carteiro(f'[[dead_letter_queues]]\nqueue = "{prefix}.dlq"\n').start()
    publish(f"{prefix}.processar", b'{"matricula": 5}', "e-5")
    d = wait_for("the dead letter archived", lambda: c.dead_letters())[0]
    fixed = tmp_path / "fixed.json"
    fixed.write_text('{"matricula_id": 5}')
    c.cli("dlq", "edit", str(d["id"]), "--body-file", str(fixed))
    wait_for("the edited copy at the consumer", lambda: "e-5 5" in processed.read_text())
    time.sleep(1)
    assert processed.read_text().splitlines() == ["e-5 5"]
    assert len(c.dead_letters()) == 1, "the edited copy did not fail again"
