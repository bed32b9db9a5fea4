"""The inbox: a message's effects apply once, on SQLite and PostgreSQL, also under concurrency."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from carteiro_outbox import add_event, claim, prune

WAIT = 30  # seconds: the bound of every wait on another thread


def consume(engine, models, message_id, *, consumer="processar_matricula", fail=False, hold=0.0) -> bool:
    """A consumer's transaction: claim first, then the effect; True if it applied the effect."""
    with Session(engine) as session, session.begin():
        if not claim(session, message_id, consumer=consumer, model=models.InboxMessage):
            return False
        session.add(models.Effect(message_id=message_id))
        if fail:
            raise RuntimeError("the handler failed after its claim")
        time.sleep(hold)  # keeps the claim uncommitted while the others try theirs
        return True


def effects(engine, models) -> list[str]:
    with Session(engine) as session:
        return list(session.scalars(select(models.Effect.message_id).order_by(models.Effect.id)))


def test_a_duplicate_is_refused(engine, models):
    assert consume(engine, models, "m-1") is True
    assert consume(engine, models, "m-1") is False  # redelivered: nothing applies
    assert consume(engine, models, "m-1", consumer="emitir_nota") is True  # another consumer's own
    assert consume(engine, models, "m-2") is True
    assert effects(engine, models) == ["m-1", "m-1", "m-2"]
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(models.InboxMessage)) == 3


def test_a_rolled_back_claim_is_claimable_again(engine, models):
    with pytest.raises(RuntimeError):
        consume(engine, models, "m-1", fail=True)
    assert effects(engine, models) == []
    assert consume(engine, models, "m-1") is True
    assert consume(engine, models, "m-1") is False
    assert effects(engine, models) == ["m-1"]


def test_concurrent_claims_of_one_message_let_exactly_one_proceed(engine, models):
    threads = 6
    start = threading.Barrier(threads)

    def attempt(_: int) -> bool:
        start.wait(timeout=WAIT)
        return consume(engine, models, "m-race", hold=0.2)

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(attempt, n) for n in range(threads)]
        results = [future.result(timeout=WAIT) for future in futures]
    assert sorted(results) == [False] * (threads - 1) + [True]
    assert effects(engine, models) == ["m-race"]


def _backend_pid(session: Session) -> int:
    return session.scalar(text("SELECT pg_backend_pid()"))


def _wait_until_blocked(engine, pid: int) -> None:
    deadline = time.monotonic() + WAIT
    with engine.connect() as connection:
        while time.monotonic() < deadline:
            waiting = connection.scalar(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            )
            if waiting == "Lock":
                return
            time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for the first claim's lock")


@pytest.mark.parametrize("first_commits", [True, False], ids=["first-commits", "first-rolls-back"])
def test_a_second_claim_waits_for_the_first_and_takes_its_outcome(engine, models, first_commits):
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL shows a waiting backend in pg_stat_activity")
    pids: list[int] = []

    def second() -> bool:
        with Session(engine) as session, session.begin():
            pids.append(_backend_pid(session))
            won = claim(session, "m-1", consumer="c", model=models.InboxMessage)
            if won:
                session.add(models.Effect(message_id="m-1"))
            return won

    with Session(engine) as first, ThreadPoolExecutor(1) as pool:
        first.begin()
        assert claim(first, "m-1", consumer="c", model=models.InboxMessage) is True
        first.add(models.Effect(message_id="m-1"))
        first.flush()
        waiting = pool.submit(second)
        deadline = time.monotonic() + WAIT
        while not pids and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pids, "the second session never started"
        _wait_until_blocked(engine, pids[0])
        with pytest.raises(TimeoutError):  # it waits as long as the first is undecided
            waiting.result(timeout=1.0)
        if first_commits:
            first.commit()
        else:
            first.rollback()
        assert waiting.result(timeout=WAIT) is (not first_commits)
    assert effects(engine, models) == ["m-1"]


@pytest.mark.parametrize("message_id", [None, "", "x" * 256])
def test_a_claim_needs_a_message_id(engine, models, message_id):
    with Session(engine) as session, pytest.raises(ValueError, match="message_id"):
        claim(session, message_id, consumer="c", model=models.InboxMessage)


def test_prune_forgets_only_old_rows(engine, models):
    for message_id in ("old-1", "old-2", "new"):
        assert consume(engine, models, message_id) is True
    table = models.InboxMessage.__table__
    with Session(engine) as session, session.begin():
        two_days_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)
        session.execute(update(table).where(table.c.message_id.like("old-%")).values(received_at=two_days_ago))
    with Session(engine) as session, session.begin():
        assert prune(session, older_than=dt.timedelta(days=1), model=models.InboxMessage) == 2
    assert consume(engine, models, "new") is False
    assert consume(engine, models, "old-1") is True  # forgotten: it applies again


def test_an_async_session_adds_events_and_claims(engine, models, request):
    if engine.dialect.name != "postgresql":
        pytest.skip("the async driver under test is psycopg's")
    postgres = request.getfixturevalue("postgres")
    async_engine = create_async_engine(postgres.url, connect_args=postgres.connect_args)

    async def run() -> list[bool]:
        results = []
        try:
            for _ in range(2):
                async with AsyncSession(async_engine) as session, session.begin():
                    first = await session.run_sync(claim, "m-async", consumer="c", model=models.InboxMessage)
                    if first:
                        add_event(session, type="t", routing_key="r", payload={}, model=models.OutboxEvent)
                    results.append(first)
        finally:
            await async_engine.dispose()
        return results

    assert asyncio.run(run()) == [True, False]
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(models.OutboxEvent)) == 1
