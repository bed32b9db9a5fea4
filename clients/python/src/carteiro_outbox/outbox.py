"""The outbox table and ``add_event``: the event joins the caller's own transaction."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from sqlalchemy import BigInteger, Boolean, DateTime, Index, Integer, String, Text, false, func
from sqlalchemy import column as sql_column
from sqlalchemy import not_
from sqlalchemy.orm import Mapped, declared_attr, mapped_column

from ._models import only_model
from .ids import new_event_id

#: The attribute names of :class:`OutboxMixin`, each also its default column name.
COLUMNS = (
    "id",
    "event_id",
    "type",
    "routing_key",
    "payload",
    "key",
    "created_at",
    "published",
    "published_at",
)

#: The column names of the story's hand-written ``outbox_events`` table, which has no
#: ``key`` column: ``__outbox_columns__ = STORY_COLUMNS`` maps the mixin onto it.
STORY_COLUMNS: Mapping[str, str | None] = {
    "event_id": "evento_id",
    "type": "tipo",
    "created_at": "criado_em",
    "published": "publicado",
    "published_at": "publicado_em",
    "key": None,
}

# AMQP short strings (routing key, type, message_id) hold at most 255 bytes.
_SHORT_STRING = 255
# The event id column's width, as in the story's table.
_EVENT_ID = 64


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def column_name(cls: type, attribute: str) -> str | None:
    """The column that holds ``attribute`` on ``cls`` (None: the column is left out)."""
    return getattr(cls, "__outbox_columns__", {}).get(attribute, attribute)


def _name(cls: type, attribute: str) -> str:
    name = column_name(cls, attribute)
    if name is None:
        raise TypeError(f"{cls.__name__}: the {attribute!r} column cannot be left out")
    return name


def outbox_indexes(cls: type) -> tuple[Index, ...]:
    """The partial index on unpublished rows, ``WHERE NOT <published>``, on the id column.

    A poll that asks for ``WHERE NOT <published> ORDER BY <id>`` reads only this index's
    unpublished entries, however many published rows the table keeps. The mixin puts it in
    ``__table_args__``; a model with its own ``__table_args__`` adds ``*outbox_indexes(cls)``.
    """
    unpublished = not_(sql_column(_name(cls, "published")))
    return (
        Index(
            f"{cls.__tablename__}_unpublished_idx",
            _name(cls, "id"),
            postgresql_where=unpublished,
            sqlite_where=unpublished,
        ),
    )


class OutboxMixin:
    """Columns of an outbox table that Carteiro's ``[[outboxes]]`` relays.

    Mix it into a declarative model and name the table::

        class OutboxEvent(OutboxMixin, Base):
            __tablename__ = "outbox_events"

    Column names default to the attribute names; ``__outbox_columns__`` renames some
    (``{"event_id": "evento_id"}``) and maps ``"key"`` to None to leave the ordering key
    out. ``__outbox_headers__`` lists attributes of your own columns that the relay sends
    as AMQP headers (see the README).
    """

    __outbox_columns__: ClassVar[Mapping[str, str | None]] = {}
    __outbox_headers__: ClassVar[tuple[str, ...]] = ()

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        unknown = set(getattr(cls, "__outbox_columns__", {})) - set(COLUMNS)
        if unknown:
            raise TypeError(f"{cls.__name__}.__outbox_columns__: unknown {sorted(unknown)}; known: {COLUMNS}")
        return outbox_indexes(cls)

    @declared_attr
    def id(cls) -> Mapped[int]:
        # BIGINT on PostgreSQL; SQLite's rowid alias must be spelled INTEGER.
        return mapped_column(
            _name(cls, "id"),
            BigInteger().with_variant(Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        )

    @declared_attr
    def event_id(cls) -> Mapped[str]:
        return mapped_column(_name(cls, "event_id"), String(_EVENT_ID), unique=True, nullable=False)

    @declared_attr
    def type(cls) -> Mapped[str]:
        return mapped_column(_name(cls, "type"), String(_SHORT_STRING), nullable=False)

    @declared_attr
    def routing_key(cls) -> Mapped[str]:
        return mapped_column(_name(cls, "routing_key"), String(_SHORT_STRING), nullable=False)

    @declared_attr
    def payload(cls) -> Mapped[str]:
        return mapped_column(_name(cls, "payload"), Text, nullable=False)

    @declared_attr
    def key(cls) -> Mapped[str | None]:
        name = column_name(cls, "key")
        if name is None:
            return None  # type: ignore[return-value]  # declarative skips a None attribute
        return mapped_column(name, String(_SHORT_STRING), nullable=True)

    @declared_attr
    def created_at(cls) -> Mapped[dt.datetime]:
        return mapped_column(
            _name(cls, "created_at"),
            DateTime(timezone=True),
            nullable=False,
            default=_utcnow,
            server_default=func.now(),
        )

    @declared_attr
    def published(cls) -> Mapped[bool]:
        return mapped_column(
            _name(cls, "published"), Boolean, nullable=False, default=False, server_default=false()
        )

    @declared_attr
    def published_at(cls) -> Mapped[dt.datetime | None]:
        return mapped_column(_name(cls, "published_at"), DateTime(timezone=True), nullable=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    raise TypeError(f"payload: {type(value).__name__} is not JSON serializable")


def encode_payload(payload: Any) -> str:
    """The payload as the text stored in the row.

    A ``str`` is stored as it is (already-serialized JSON, or any text). Anything else is
    serialized as compact JSON, with datetimes as ISO 8601 and UUIDs and Decimals as strings.
    """
    if isinstance(payload, str):
        return payload
    if isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError("payload: the column is text; pass a str or a JSON-serializable value")
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=_json_default)


def _check_short_string(what: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, got {value!r}")
    if len(value.encode()) > _SHORT_STRING:
        raise ValueError(f"{what} is longer than AMQP's {_SHORT_STRING} bytes: {value[:40]!r}...")


def add_event(
    session: Any,
    *,
    type: str,
    routing_key: str,
    payload: Any,
    key: str | None = None,
    headers: Mapping[str, Any] | None = None,
    event_id: str | None = None,
    model: type | None = None,
) -> str:
    """Add one event to ``session`` and return its event id.

    The row is only added: it is written when the caller's transaction flushes and commits,
    and vanishes with its rollback. Nothing here commits. ``event_id`` is a new UUIDv7 unless
    given (a deterministic id makes a second add of the same event fail on the unique
    index). ``headers`` sets the model's header columns (``__outbox_headers__``).
    ``model`` defaults to the only mapped :class:`OutboxMixin` model. ``session`` may be a
    ``Session`` or an ``AsyncSession``.
    """
    model = only_model(OutboxMixin, model, "add_event")
    _check_short_string("type", type)
    _check_short_string("routing_key", routing_key)
    event_id = new_event_id() if event_id is None else event_id
    if not isinstance(event_id, str) or not 0 < len(event_id) <= _EVENT_ID:
        raise ValueError(f"event_id must be a str of 1 to {_EVENT_ID} characters, got {event_id!r}")
    row = model(
        event_id=event_id,
        type=type,
        routing_key=routing_key,
        payload=encode_payload(payload),
        published=False,
    )
    if key is not None:
        if column_name(model, "key") is None:
            raise TypeError(f"{model.__name__} has no key column; add_event(key=...) needs one")
        _check_short_string("key", key)
        row.key = key
    for name, value in (headers or {}).items():
        if name not in model.__outbox_headers__:
            raise ValueError(
                f"header {name!r} is not among {model.__name__}.__outbox_headers__ "
                f"{tuple(model.__outbox_headers__)!r}"
            )
        setattr(row, name, value)
    session.add(row)
    return event_id
