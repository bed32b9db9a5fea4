"""The ``[[outboxes]]`` block of Carteiro's configuration that relays a model's table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import inspect

from .outbox import COLUMNS, column_name

# The keys of [outboxes.columns], in the order the configuration reference shows them.
CONFIG_COLUMNS = ("id", "event_id", "type", "routing_key", "payload", "published", "published_at", "key")

_COMMENTS = {
    "exchange": "must already exist: Carteiro checks it at start",
    "mode_poll": 'or "cdc" (PostgreSQL)',
    "mode_cdc": "a publication and a replication slot on this database",
    "headers": "sent as AMQP headers named after the columns",
}


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string."""
    escapes = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
    out = []
    for char in value:
        if char in escapes:
            out.append(escapes[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def carteiro_url(url: str) -> str:
    """A SQLAlchemy database URL in the form Carteiro reads.

    ``postgresql+psycopg://u@h/db`` becomes ``postgres://u@h/db`` (query parameters such as
    ``sslmode`` kept); SQLAlchemy's ``sqlite:///rel.db`` and ``sqlite:////abs.db`` become
    ``sqlite://rel.db`` and ``sqlite:///abs.db``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {url!r}")
    backend = scheme.split("+", 1)[0].lower()
    if backend in ("postgresql", "postgres"):
        return "postgres://" + rest
    if backend == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if path in ("", ":memory:"):
            raise ValueError("an in-memory SQLite database cannot be relayed: give a file")
        return "sqlite://" + path
    raise ValueError(f"Carteiro relays PostgreSQL and SQLite tables, not {backend!r}: {url!r}")


def model_columns(model: type) -> tuple[str, dict[str, str], list[str]]:
    """The table name, the ``[outboxes.columns]`` entries and the header columns of ``model``."""
    mapper = inspect(model)
    columns = {}
    for attribute in CONFIG_COLUMNS:
        if column_name(model, attribute) is not None:
            columns[attribute] = mapper.columns[attribute].name
    headers = [mapper.columns[attribute].name for attribute in model.__outbox_headers__]
    return model.__table__.fullname, columns, headers


def default_columns(renames: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The ``[outboxes.columns]`` entries of a model with ``__outbox_columns__ = renames``."""
    renames = renames or {}
    names = {attribute: renames.get(attribute, attribute) for attribute in COLUMNS}
    return {a: names[a] for a in CONFIG_COLUMNS if names[a] is not None}  # type: ignore[misc]


def outbox_config(
    *,
    url: str,
    table: str,
    columns: Mapping[str, str],
    exchange: str,
    name: str | None = None,
    mode: str = "poll",
    headers: Sequence[str] = (),
) -> str:
    """The ``[[outboxes]]`` TOML block for one table, ready to paste into Carteiro's file."""
    if mode not in ("poll", "cdc"):
        raise ValueError(f'mode must be "poll" or "cdc", got {mode!r}')
    url = carteiro_url(url)
    if mode == "cdc" and not url.startswith("postgres://"):
        raise ValueError('mode = "cdc" needs PostgreSQL (logical replication)')
    missing = [key for key in ("id", "event_id", "payload") if key not in columns]
    if missing:
        raise ValueError(f"the outbox needs the {', '.join(missing)} column(s)")

    def line(key: str, value: str, comment: str | None = None) -> str:
        text = f"{key} = {value}"
        return f"{text:<30} # {comment}" if comment else text

    lines = [
        "[[outboxes]]",
        line("name", toml_string(name or table.rsplit(".", 1)[-1])),
        line("url", toml_string(url)),
        line("table", toml_string(table)),
        line("exchange", toml_string(exchange), _COMMENTS["exchange"]),
        line("mode", toml_string(mode), _COMMENTS[f"mode_{mode}"]),
        "",
        "[outboxes.columns]",
    ]
    lines += [line(key, toml_string(columns[key])) for key in CONFIG_COLUMNS if key in columns]
    if headers:
        listed = "[" + ", ".join(toml_string(h) for h in headers) + "]"
        lines.append(line("headers", listed, _COMMENTS["headers"]))
    return "\n".join(lines) + "\n"
