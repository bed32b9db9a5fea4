"""Engines for both backends and fresh models per test.

SQLite: a file in the test's tmp_path. PostgreSQL: CARTEIRO_TEST_POSTGRES_URL (skipped when
unset, an error when set and unreachable), in a schema of this run's own that is dropped at
the end, so runs never see each other's tables.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine, String, create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from carteiro_outbox import InboxMixin, OutboxMixin

POSTGRES_URL = os.environ.get("CARTEIRO_TEST_POSTGRES_URL")
BACKENDS = ["sqlite", "postgres"]
_tables = itertools.count()


def sqlalchemy_postgres_url(url: str) -> str:
    return "postgresql+psycopg://" + url.partition("://")[2]


@pytest.fixture(scope="session")
def postgres() -> Iterator[SimpleNamespace]:
    """url and connect_args of a schema of this run's own, dropped at the end."""
    if not POSTGRES_URL:
        pytest.skip("CARTEIRO_TEST_POSTGRES_URL is not set")
    url = sqlalchemy_postgres_url(POSTGRES_URL)
    schema = f"carteiro_py_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, connect_args={"connect_timeout": 10})
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    options = f"-csearch_path={schema} -cstatement_timeout=20000"
    try:
        yield SimpleNamespace(url=url, connect_args={"connect_timeout": 10, "options": options})
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def make_engine(backend: str, request: pytest.FixtureRequest, tmp_path) -> Engine:
    if backend == "sqlite":
        # A file, not :memory:, so that several connections (threads) share the database.
        return create_engine(
            f"sqlite:///{tmp_path}/app.db", connect_args={"timeout": 20, "check_same_thread": False}
        )
    postgres = request.getfixturevalue("postgres")
    return create_engine(postgres.url, pool_size=10, connect_args=postgres.connect_args)


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path) -> Iterator[Engine]:
    engine = make_engine(request.param, request, tmp_path)
    yield engine
    engine.dispose()


def declare_models(table_suffix: str) -> SimpleNamespace:
    """A fresh declarative base with an outbox (key and a header column) and an inbox."""

    class Base(DeclarativeBase):
        pass

    class OutboxEvent(OutboxMixin, Base):
        __tablename__ = f"outbox_events_{table_suffix}"
        __outbox_columns__ = {"event_id": "evento_id"}
        __outbox_headers__ = ("tenant",)
        tenant: Mapped[str | None] = mapped_column("inquilino", String(80))

    class InboxMessage(InboxMixin, Base):
        __tablename__ = f"inbox_messages_{table_suffix}"

    class Effect(Base):
        """What a consumer does: one row per application of a message's effects."""

        __tablename__ = f"effects_{table_suffix}"
        id: Mapped[int] = mapped_column(primary_key=True)
        message_id: Mapped[str] = mapped_column(String(255))

    return SimpleNamespace(Base=Base, OutboxEvent=OutboxEvent, InboxMessage=InboxMessage, Effect=Effect)


@pytest.fixture
def models(engine: Engine) -> Iterator[SimpleNamespace]:
    """Fresh models whose tables exist in ``engine`` for this test only."""
    declared = declare_models(f"{os.getpid()}_{next(_tables)}")
    declared.Base.metadata.create_all(engine)
    yield declared
    declared.Base.metadata.drop_all(engine)
