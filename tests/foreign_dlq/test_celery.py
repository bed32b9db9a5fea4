"""A real Celery worker's tasks that fail for good, archived by Carteiro through the documented
snippet, found by task and reason, and replayed in one command after the fix (issue 37)."""

import os
import sys
import time
from pathlib import Path

import aio_pika

from conftest import AMQP_URL, HERE, amqp, wait_for

CONFIG = """
[[dead_letter_queues]]
queue = "cursos.dlq"
route = "cursos"
"""


def declare_dead_letters():
    async def declare(channel):
        for queue in ("cursos", "cursos.dlq"):
            await channel.queue_delete(queue)
        dlx = await channel.declare_exchange("cursos.dlx", aio_pika.ExchangeType.DIRECT, durable=True)
        dlq = await channel.declare_queue("cursos.dlq", durable=True)
        await dlq.bind(dlx, routing_key="cursos.falhas")

    amqp(declare)


def test_the_snippet_is_the_documented_one():
    docs = (HERE / "../../docs/dead-letters.md").read_text()
    snippet = (HERE / "celery_dead_letters.py").read_text()
    assert snippet.strip() in docs, "docs/dead-letters.md must show celery_dead_letters.py as it is"


def test_failed_tasks_are_archived_as_tasks_and_replayed_once_after_the_fix(tmp_path, running):
    carteiro, service = running
    declare_dead_letters()
    processed, fixed = tmp_path / "processed.txt", tmp_path / "fixed"
    processed.touch()
    env = {"AMQP_URL": AMQP_URL, "PROCESSED": str(processed), "FIXED_FLAG": str(fixed)}
    os.environ.update(env)
    service([sys.executable, "-m", "celery", "-A", "celery_app", "worker", "-Q", "cursos",
             "-P", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-l", "info"], env, ready="ready")
    c = carteiro(CONFIG).start()
    sys.path.insert(0, str(HERE))
    from celery_app import liberar_acesso_curso

    for i in range(3):
        liberar_acesso_curso.delay(i, f"ev-{i}")
    rows = wait_for("3 failed tasks archived", lambda: len(c.dead_letters()) == 3 and c.dead_letters())
    assert {r["route"] for r in rows} == {"cursos"}
    assert {r["task"] for r in rows} == {"liberar_acesso_curso"}
    assert all(r["reason"].startswith("IntegrityError: duplicate key") for r in rows), rows
    one = c.dead_letters("--search", "body.args[0] = 1")
    assert len(one) == 1
    shown = c.show(one[0]["id"])
    assert shown["celery"]["task"] == "liberar_acesso_curso"
    assert shown["celery"]["args"] == [1, "ev-1"]
    assert shown["celery"]["kwargs"] == {}
    assert len(c.dead_letters("--search", "task:liberar_acesso_curso")) == 3
    page = c.console_page(one[0]["id"], screenshot="celery-task")
    for shown in ("Celery task", "liberar_acesso_curso", "IntegrityError", "Replays to"):
        assert shown in page, shown
    assert c.dead_letters("--search", "task:outra_task") == []

    # The fix, then the story's batch replay by reason, in one command.
    fixed.touch()
    out = c.cli("dlq", "replay", "--reason", "IntegrityError").stdout
    assert "3 replayed" in out, out
    wait_for("the worker running each once", lambda: len(processed.read_text().splitlines()) >= 3)
    time.sleep(2)  # long enough for a second copy to run, were one sent
    assert sorted(processed.read_text().splitlines()) == ["0 ev-0", "1 ev-1", "2 ev-2"]
    assert len(c.dead_letters()) == 3, "nothing failed again"
