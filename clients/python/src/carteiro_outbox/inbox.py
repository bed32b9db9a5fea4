"""The consumer half: an inbox table and ``claim``, so a message's effects apply once."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DateTime, Index, String, delete, func, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from ._models import only_model

# An AMQP message_id is a short string: at most 255 bytes.
_MESSAGE_ID = 255


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class InboxMixin:
    """One row per (consumer, message id) whose effects have been applied.

    Mix it into a declarative model and name the table::

        class InboxMessage(InboxMixin, Base):
            __tablename__ = "inbox_messages"

    The primary key (consumer, message_id) is what makes :func:`claim` exact under
    concurrency; ``received_at`` (indexed) lets :func:`prune` forget old rows.
    """

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        return (Index(f"{cls.__tablename__}_received_at_idx", "received_at"),)

    @declared_attr
    def consumer(cls) -> Mapped[str]:
        return mapped_column(String(200), primary_key=True)

    @declared_attr
    def message_id(cls) -> Mapped[str]:
        return mapped_column(String(_MESSAGE_ID), primary_key=True)

    @declared_attr
    def received_at(cls) -> Mapped[dt.datetime]:
        return mapped_column(
            DateTime(timezone=True), nullable=False, default=_utcnow, server_default=func.now()
        )


def claim(session: Any, message_id: str | None, *, consumer: str, model: type | None = None) -> bool:
    """Claim ``message_id`` for ``consumer`` in the session's transaction: True the first time.

    Call it first in the transaction that applies the message's effects, apply them only on
    True, and let that transaction commit both. The claim is an INSERT ... ON CONFLICT DO
    NOTHING on the (consumer, message_id) primary key, so:

    - a message id already committed returns False (a redelivery or a replay: ack it);
    - of two transactions claiming one id at once, the second waits for the first and
      returns False if it commits, True if it rolls back;
    - a rolled-back claim leaves nothing behind: the message can be claimed again.

    PostgreSQL, and SQLite 3.35 or later (for RETURNING). For an ``AsyncSession``:
    ``await session.run_sync(claim, message_id, consumer=...)``.
    """
    model = only_model(InboxMixin, model, "claim")
    if not isinstance(message_id, str) or not message_id:
        raise ValueError(
            f"claim: message_id must be a non-empty str, got {message_id!r} "
            "(did the publisher set the AMQP message_id? Carteiro sets it to the event id)"
        )
    if len(message_id.encode()) > _MESSAGE_ID:
        raise ValueError(f"claim: message_id is longer than {_MESSAGE_ID} bytes")
    mapper = inspect(model)
    dialect = session.get_bind(mapper=mapper).dialect.name
    dialect_insert = {"postgresql": postgresql.insert, "sqlite": sqlite.insert}.get(dialect)
    if dialect_insert is None:
        raise NotImplementedError(f"claim: {dialect} is not supported (PostgreSQL and SQLite are)")
    table = model.__table__
    statement = (
        dialect_insert(table)
        .values(consumer=consumer, message_id=message_id, received_at=_utcnow())
        .on_conflict_do_nothing(index_elements=[table.c.consumer, table.c.message_id])
        # A row comes back only if this INSERT wrote it (an INSERT's rowcount is not
        # reliable across drivers: psycopg's reads -1 through SQLAlchemy).
        .returning(table.c.message_id)
    )
    return session.execute(statement, bind_arguments={"mapper": mapper}).first() is not None


def prune(session: Any, *, older_than: dt.timedelta, model: type | None = None) -> int:
    """Delete inbox rows received more than ``older_than`` ago; returns how many.

    A message redelivered or replayed after its row is gone applies again: keep rows longer
    than the oldest message that can still arrive (dead letters can be replayed for as long
    as they are kept). Nothing here commits.
    """
    model = only_model(InboxMixin, model, "prune")
    table = model.__table__
    cutoff = _utcnow() - older_than
    result = session.execute(
        delete(table).where(table.c.received_at < cutoff), bind_arguments={"mapper": inspect(model)}
    )
    return result.rowcount
