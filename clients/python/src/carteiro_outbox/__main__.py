"""``python -m carteiro_outbox config ...``: print the ``[[outboxes]]`` block for a table."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .config import default_columns, model_columns, outbox_config
from .outbox import STORY_COLUMNS


def _load_model(spec: str) -> type:
    module_name, sep, attribute = spec.partition(":")
    if not sep or not attribute:
        raise SystemExit(f"--model: expected MODULE:CLASS, e.g. app.models:OutboxEvent, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # the console script, like `python -m`, imports from here
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target  # type: ignore[return-value]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m carteiro_outbox")
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser(
        "config",
        help="print the [[outboxes]] block of Carteiro's configuration for an outbox table",
        description="Print the [[outboxes]] block that relays an outbox table, derived from "
        "the model (--model), from the story's hand-written table (--story), or from "
        "OutboxMixin's default names.",
    )
    source = config.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="MODULE:CLASS", help="the OutboxMixin model, e.g. app.models:OutboxEvent")
    source.add_argument(
        "--story", action="store_true", help="the hand-written outbox_events table (evento_id, tipo, publicado, ...)"
    )
    config.add_argument("--url", required=True, help="the application's database, as a SQLAlchemy URL")
    config.add_argument("--exchange", required=True, help="the exchange the events are published to")
    config.add_argument("--table", help="the table, without --model (default outbox_events)")
    config.add_argument("--name", help="the outbox's name (default: the table's)")
    config.add_argument("--mode", choices=("poll", "cdc"), default="poll")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.model:
        if args.table:
            raise SystemExit("--table: the table comes from --model")
        table, columns, headers = model_columns(_load_model(args.model))
    else:
        table = args.table or "outbox_events"
        columns, headers = default_columns(STORY_COLUMNS if args.story else None), []
    try:
        block = outbox_config(
            url=args.url,
            table=table,
            columns=columns,
            exchange=args.exchange,
            name=args.name,
            mode=args.mode,
            headers=headers,
        )
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
