"""What every peer does with one `matricula.confirmada` message: the same effects as the
enrollment plugin (plugins/enrollment/src/lib.rs), written the way a team would by hand.

Effects, in one database transaction: an idempotency row for the message id, the
enrollment row (the business row; it records its commit time for the latency figures) and
three outbox rows (`acesso.liberado`, `fatura.solicitada`, `email.solicitado`), which a
polling publisher (relay.py) publishes afterwards.

The failure mix is encoded in the body, so every peer fails the same messages the same way:
- not JSON / missing fields -> PoisonError (dead-letter at once, like the plugin);
- `"fail_until_attempt": N` -> TransientError on attempts before N ("dependency down").
"""

import json
import time
import uuid

from sqlalchemy import (BigInteger, Column, Integer, MetaData, String, Table, Text, select)
from sqlalchemy.dialects import postgresql, sqlite

EVENTS = ("acesso.liberado", "fatura.solicitada", "email.solicitado")
MAX_ATTEMPTS = 5  # as Carteiro's bench route: attempts before dead-lettering
RETRY_DELAY_S = 0.2

metadata = MetaData()
processed = Table(
    "processed_messages", metadata,
    Column("message_id", String, primary_key=True),
    Column("processed_at_ms", BigInteger, nullable=False),
)
enrollments = Table(
    "enrollments", metadata,
    Column("matricula_id", String, primary_key=True),
    Column("usuario_id", String, nullable=False),
    Column("curso_id", String, nullable=False),
    Column("message_id", String, nullable=False),
    Column("committed_at_ms", BigInteger, nullable=False),
)
outbox = Table(
    "outbox", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String, nullable=False, unique=True),
    Column("exchange", String, nullable=False),
    Column("routing_key", String, nullable=False),
    Column("causation_id", String, nullable=False),
    Column("payload", Text, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("published_at_ms", BigInteger),
)
# Celery's manual error table (the aio-pika pattern dead-letters to its DLQ instead).
failed = Table(
    "failed_messages", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String, nullable=False),
    Column("reason", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("failed_at_ms", BigInteger, nullable=False),
)


class PoisonError(Exception):
    """The message can never succeed: dead-letter it."""


class TransientError(Exception):
    """A dependency failed; the same message may succeed later."""


def now_ms():
    return int(time.time() * 1000)


def parse(body):
    """The enrollment fields, or PoisonError (as the plugin's dead-letter verdict)."""
    try:
        doc = json.loads(body)
        ids = {k: doc[k] for k in ("matricula_id", "usuario_id", "curso_id")}
    except (ValueError, TypeError, KeyError) as e:
        raise PoisonError(f"invalid matricula.confirmada: {e}") from e
    for k, v in ids.items():
        if isinstance(v, bool) or not isinstance(v, (str, int)) or v == "":
            raise PoisonError(f"invalid matricula.confirmada: bad {k}")
    return ids, doc.get("fail_until_attempt")


def call_dependency(fail_until_attempt, attempt):
    """Stands in for the content service the enrollment needs: down for the first tries."""
    if fail_until_attempt is not None and attempt < int(fail_until_attempt):
        raise TransientError(f"content service unavailable (attempt {attempt})")


def _insert(conn, table):
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def record_statements(conn, message_id, ids, exchange):
    """The statements of one message's transaction, as (statement, params) steps a sync or
    async connection runs in order. Returns a generator so both flavours share the logic."""
    t = now_ms()
    claimed = yield (_insert(conn, processed).values(message_id=message_id, processed_at_ms=t)
                     .on_conflict_do_nothing(index_elements=["message_id"]))
    if claimed.rowcount == 0:
        return "duplicate"  # this message's effects are already committed
    existing = yield select(enrollments.c.usuario_id, enrollments.c.curso_id).where(
        enrollments.c.matricula_id == str(ids["matricula_id"]))
    row = existing.first()
    if row is not None:
        if (row.usuario_id, row.curso_id) == (str(ids["usuario_id"]), str(ids["curso_id"])):
            return "already-enrolled"  # a business-level duplicate: no new events
        raise PoisonError(f"matricula {ids['matricula_id']} confirmed with other ids")
    yield enrollments.insert().values(
        matricula_id=str(ids["matricula_id"]), usuario_id=str(ids["usuario_id"]),
        curso_id=str(ids["curso_id"]), message_id=message_id, committed_at_ms=t)
    payload = json.dumps(ids)
    yield outbox.insert(), [
        dict(event_id=str(uuid.uuid4()), exchange=exchange, routing_key=key,
             causation_id=message_id, payload=payload, created_at_ms=t)
        for key in EVENTS
    ]
    return "recorded"


def async_engine(url, size):
    """An async engine keeping `size` connections open. (aiosqlite defaults to NullPool, a
    new connection and thread per transaction: a handicap no team would keep.)"""
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import AsyncAdaptedQueuePool
    args = {"timeout": 30} if url.startswith("sqlite") else {}
    return create_async_engine(url, poolclass=AsyncAdaptedQueuePool, pool_size=size,
                               connect_args=args)


def _step(step):
    return step if isinstance(step, tuple) else (step, None)


def record_sync(conn, message_id, ids, exchange):
    """Runs one message's statements on a SQLAlchemy Connection inside its transaction."""
    steps = record_statements(conn, message_id, ids, exchange)
    result = None
    try:
        while True:
            stmt, params = _step(steps.send(result))
            result = conn.execute(stmt, params)
    except StopIteration as done:
        return done.value


async def record_async(conn, message_id, ids, exchange):
    """The same on an AsyncConnection."""
    steps = record_statements(conn, message_id, ids, exchange)
    result = None
    try:
        while True:
            stmt, params = _step(steps.send(result))
            result = await conn.execute(stmt, params)
    except StopIteration as done:
        return done.value
