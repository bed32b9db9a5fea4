"""The [[outboxes]] block: valid TOML naming the columns the model really has."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib

import pytest
from sqlalchemy import inspect

from carteiro_outbox.config import carteiro_url, model_columns, outbox_config, toml_string

# The block the configuration reference shows for the story's hand-written table.
STORY_BLOCK = {
    "name": "matriculas",
    "url": "postgres://app@db:5432/matriculas",
    "table": "outbox_events",
    "exchange": "matriculas",
    "mode": "poll",
    "columns": {
        "id": "id",
        "event_id": "evento_id",
        "type": "tipo",
        "routing_key": "routing_key",
        "payload": "payload",
        "published": "publicado",
        "published_at": "publicado_em",
    },
}


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "carteiro_outbox", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_the_story_preset_prints_the_documented_block():
    done = run_cli(
        "config", "--story", "--url", "postgresql+psycopg://app@db:5432/matriculas",
        "--name", "matriculas", "--exchange", "matriculas",
    )
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout) == {"outboxes": [STORY_BLOCK]}


def test_the_model_block_names_the_tables_real_columns(tmp_path):
    # A model whose columns are renamed, with a key and a header column.
    (tmp_path / "app_models.py").write_text(
        textwrap.dedent(
            """
            from sqlalchemy import String
            from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
            from carteiro_outbox import OutboxMixin

            class Base(DeclarativeBase):
                pass

            class OutboxEvent(OutboxMixin, Base):
                __tablename__ = "eventos"
                __outbox_columns__ = {"event_id": "evento_id", "key": "chave", "published": "publicado"}
                __outbox_headers__ = ("tenant",)
                tenant: Mapped[str] = mapped_column("inquilino", String(80), nullable=True)
            """
        )
    )
    done = run_cli(
        "config", "--model", "app_models:OutboxEvent", "--url", "sqlite:////var/lib/app/app.db",
        "--exchange", "eventos", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (block,) = tomllib.loads(done.stdout)["outboxes"]
    assert {k: v for k, v in block.items() if k != "columns"} == {
        "name": "eventos",
        "url": "sqlite:///var/lib/app/app.db",
        "table": "eventos",
        "exchange": "eventos",
        "mode": "poll",
    }
    assert block["columns"] == {
        "id": "id",
        "event_id": "evento_id",
        "type": "type",
        "routing_key": "routing_key",
        "payload": "payload",
        "published": "publicado",
        "published_at": "published_at",
        "key": "chave",
        "headers": ["inquilino"],
    }


def test_every_named_column_exists_in_the_created_table(engine, models):
    table, columns, headers = model_columns(models.OutboxEvent)
    block = tomllib.loads(outbox_config(url="sqlite:///app.db", table=table, columns=columns, headers=headers, exchange="x"))
    named = block["outboxes"][0]["columns"]
    created = {column["name"] for column in inspect(engine).get_columns(table)}
    assert set(named.pop("headers")) | set(named.values()) <= created
    assert set(named) == {"id", "event_id", "type", "routing_key", "payload", "published", "published_at", "key"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql+psycopg://app:${PGPASSWORD}@db/m?sslmode=require", "postgres://app:${PGPASSWORD}@db/m?sslmode=require"),
        ("postgresql://app@db/m", "postgres://app@db/m"),
        ("postgres://app@db/m", "postgres://app@db/m"),
        ("sqlite:///app.db", "sqlite://app.db"),
        ("sqlite+pysqlite:////srv/app.db", "sqlite:///srv/app.db"),
    ],
)
def test_urls_are_written_in_carteiros_form(given, expected):
    assert carteiro_url(given) == expected


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "mysql://db/app", "app.db"])
def test_urls_carteiro_cannot_relay_are_refused(url):
    with pytest.raises(ValueError):
        carteiro_url(url)


def test_cdc_needs_postgres_and_errors_exit_non_zero():
    done = run_cli("config", "--url", "sqlite:///app.db", "--exchange", "x", "--mode", "cdc")
    assert done.returncode != 0 and "PostgreSQL" in done.stderr
    done = run_cli("config", "--url", "postgresql://db/app", "--exchange", "x", "--mode", "cdc")
    assert done.returncode == 0 and tomllib.loads(done.stdout)["outboxes"][0]["mode"] == "cdc"


@pytest.mark.parametrize("value", ['a"b', "a\\b", "tab\tnew\nline", "\x00\x1f\x7f", "ção 📬", "${VAR}"])
def test_toml_strings_read_back_unchanged(value):
    assert tomllib.loads(f"v = {toml_string(value)}")["v"] == value
