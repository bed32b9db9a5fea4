"""The outbox table and add_event, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import DeclarativeBase, Session

from carteiro_outbox import STORY_COLUMNS, OutboxMixin, add_event, new_event_id
from carteiro_outbox.outbox import encode_payload


def count(engine: Engine, model) -> int:
    with engine.connect() as connection:
        return connection.scalar(select(func.count()).select_from(model.__table__))


def test_add_event_in_a_rolled_back_transaction_leaves_no_row(engine, models):
    with Session(engine) as session:
        session.begin()
        add_event(session, type="t", routing_key="r", payload={"n": 1}, model=models.OutboxEvent)
        session.flush()
        # Written inside the transaction, so it is the rollback that takes it away.
        assert session.scalar(select(func.count()).select_from(models.OutboxEvent)) == 1
        session.rollback()
    assert count(engine, models.OutboxEvent) == 0


def test_add_event_does_not_commit(engine, models):
    with Session(engine) as session, session.begin():
        add_event(session, type="t", routing_key="r", payload="{}", model=models.OutboxEvent)
        session.flush()
        assert count(engine, models.OutboxEvent) == 0  # another connection sees nothing yet
    assert count(engine, models.OutboxEvent) == 1


def test_committed_rows_appear_with_one_event_id_each(engine, models):
    returned = []
    for batch in range(5):
        with Session(engine) as session, session.begin():
            for n in range(10):
                returned.append(
                    add_event(
                        session,
                        type="matricula.confirmada",
                        routing_key="matricula.confirmada",
                        payload={"matricula_id": batch * 10 + n, "curso": "rust"},
                        model=models.OutboxEvent,
                    )
                )
    with Session(engine) as session:
        rows = session.scalars(select(models.OutboxEvent).order_by(models.OutboxEvent.id)).all()
    assert [row.event_id for row in rows] == returned
    assert len(set(returned)) == 50
    for n, row in enumerate(rows):
        assert uuid.UUID(row.event_id).version == 7
        assert json.loads(row.payload) == {"matricula_id": n, "curso": "rust"}
        assert row.published is False and row.published_at is None and row.created_at is not None
        assert row.key is None


def test_key_and_headers_are_written(engine, models):
    with Session(engine) as session, session.begin():
        event_id = add_event(
            session,
            type="t",
            routing_key="r",
            payload=[1, 2],
            key="matricula-7",
            headers={"tenant": "acme"},
            model=models.OutboxEvent,
        )
    with Session(engine) as session:
        row = session.scalars(select(models.OutboxEvent)).one()
    assert (row.event_id, row.key, row.tenant, row.payload) == (event_id, "matricula-7", "acme", "[1,2]")


def test_a_given_event_id_is_kept_and_a_second_add_fails_on_the_unique_index(engine, models):
    with Session(engine) as session, session.begin():
        assert add_event(session, type="t", routing_key="r", payload="x", event_id="e-1", model=models.OutboxEvent) == "e-1"
    with pytest.raises(Exception, match="(?i)unique"):
        with Session(engine) as session, session.begin():
            add_event(session, type="t", routing_key="r", payload="x", event_id="e-1", model=models.OutboxEvent)
    assert count(engine, models.OutboxEvent) == 1


def test_the_partial_index_exists_and_the_poll_query_uses_it(engine, models):
    table = models.OutboxEvent.__table__
    index = f"{table.name}_unpublished_idx"
    poll = f"SELECT id FROM {table.name} WHERE NOT published ORDER BY id LIMIT 100"
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            definition = connection.scalar(
                text("SELECT indexdef FROM pg_indexes WHERE indexname = :name AND schemaname = current_schema()"),
                {"name": index},
            )
            assert definition is not None and definition.endswith("(id) WHERE (NOT published)")
            # An empty table is read whole anyway; with scans off, only a usable index is taken.
            connection.execute(text("SET LOCAL enable_seqscan = off"))
            for query in (poll, poll.replace("NOT published", "published = false")):
                plan = "\n".join(connection.scalars(text(f"EXPLAIN {query}")))
                assert index in plan, plan
        else:
            definition = connection.scalar(
                text("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :name"), {"name": index}
            )
            assert definition is not None and definition.endswith("(id) WHERE NOT published")
            plan = " ".join(row[-1] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {poll}")))
            assert index in plan, plan


def test_the_story_table_is_mapped_by_story_columns(engine):
    # The shape the issue gives for the hand-written table: serial id, varchar(64) unique
    # evento_id, varchar(80) tipo and routing_key, text payload, timestamps, a boolean with no
    # database default, and no key column.
    name = f"story_outbox_{uuid.uuid4().hex[:8]}"
    serial = "SERIAL" if engine.dialect.name == "postgresql" else "INTEGER"
    with engine.begin() as connection:
        connection.execute(
            text(
                f"CREATE TABLE {name} (id {serial} PRIMARY KEY, evento_id VARCHAR(64) NOT NULL UNIQUE, "
                "tipo VARCHAR(80) NOT NULL, routing_key VARCHAR(80) NOT NULL, payload TEXT NOT NULL, "
                "criado_em TIMESTAMP NOT NULL, publicado BOOLEAN NOT NULL, publicado_em TIMESTAMP)"
            )
        )
    try:

        class Base(DeclarativeBase):
            pass

        class OutboxEvent(OutboxMixin, Base):
            __tablename__ = name
            __outbox_columns__ = STORY_COLUMNS

        assert not hasattr(OutboxEvent.__table__.c, "key")
        with Session(engine) as session, session.begin():
            event_id = add_event(
                session, type="matricula.confirmada", routing_key="matricula.confirmada",
                payload={"matricula_id": 1}, model=OutboxEvent,
            )
        with engine.connect() as connection:
            row = connection.execute(
                text(f"SELECT evento_id, tipo, payload, publicado, publicado_em, criado_em FROM {name}")
            ).one()
        assert row[:5] == (event_id, "matricula.confirmada", '{"matricula_id":1}', False, None)
        assert row.criado_em is not None
        with pytest.raises(TypeError, match="no key column"):
            add_event(Session(engine), type="t", routing_key="r", payload="x", key="k", model=OutboxEvent)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE {name}"))


def test_payload_encoding():
    assert encode_payload({"a": 1, "b": "ç"}) == '{"a":1,"b":"ç"}'
    assert encode_payload('{"already": "json"}') == '{"already": "json"}'
    when = dt.datetime(2026, 7, 12, 22, 0, tzinfo=dt.timezone.utc)
    ident = uuid.UUID(int=1)
    assert json.loads(encode_payload({"t": when, "u": ident, "d": decimal.Decimal("9.90")})) == {
        "t": "2026-07-12T22:00:00+00:00",
        "u": str(ident),
        "d": "9.90",
    }
    with pytest.raises(TypeError):
        encode_payload(b"bytes")
    with pytest.raises(TypeError):
        encode_payload({"s": {1, 2}})


def test_add_event_refuses_what_amqp_cannot_carry():
    class Base(DeclarativeBase):
        pass

    class Outbox(OutboxMixin, Base):
        __tablename__ = "validation_outbox"
        __outbox_headers__ = ()

    session = Session()
    with pytest.raises(ValueError, match="routing_key"):
        add_event(session, type="t", routing_key="r" * 256, payload="x", model=Outbox)
    with pytest.raises(ValueError, match="routing_key"):
        add_event(session, type="t", routing_key=None, payload="x", model=Outbox)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="type"):
        add_event(session, type="", routing_key="r", payload="x", model=Outbox)
    with pytest.raises(ValueError, match="event_id"):
        add_event(session, type="t", routing_key="r", payload="x", event_id="e" * 65, model=Outbox)
    with pytest.raises(ValueError, match="header 'tenant'"):
        add_event(session, type="t", routing_key="r", payload="x", headers={"tenant": "a"}, model=Outbox)
    assert not session.new
    add_event(session, type="t", routing_key="r" * 255, payload="x", model=Outbox)
    assert len(session.new) == 1


def test_unknown_column_renames_are_refused():
    class Base(DeclarativeBase):
        pass

    with pytest.raises(TypeError, match="evento_id"):

        class Outbox(OutboxMixin, Base):
            __tablename__ = "typo_outbox"
            __outbox_columns__ = {"evento_id": "evento_id"}


def test_event_ids_are_uuid7_in_time_order():
    before = time.time_ns() // 1_000_000
    first = new_event_id()
    time.sleep(0.002)
    second = new_event_id()
    after = time.time_ns() // 1_000_000
    for ident in (first, second):
        parsed = uuid.UUID(ident)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
        assert before <= parsed.int >> 80 <= after
    assert first < second
    assert len({new_event_id() for _ in range(10_000)}) == 10_000


def test_add_event_finds_the_only_outbox_model(tmp_path):
    script = textwrap.dedent(
        """
        from sqlalchemy import create_engine, select
        from sqlalchemy.orm import DeclarativeBase, Session
        from carteiro_outbox import OutboxMixin, add_event

        class Base(DeclarativeBase):
            pass

        class OutboxEvent(OutboxMixin, Base):
            __tablename__ = "outbox_events"

        engine = create_engine("sqlite://")
        Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            event_id = add_event(session, type="t", routing_key="r", payload={})
        with Session(engine) as session:
            assert session.scalars(select(OutboxEvent.event_id)).all() == [event_id]

        class Other(OutboxMixin, Base):
            __tablename__ = "other_outbox"

        try:
            add_event(Session(engine), type="t", routing_key="r", payload={})
        except TypeError as error:
            assert "Other, OutboxEvent" in str(error), error
        else:
            raise AssertionError("two outbox models and no model=: expected TypeError")
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
