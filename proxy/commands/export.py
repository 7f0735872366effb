"""`onthejob export`: trajectories as JSON Lines (the public export format)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.commands import add_db, proxy_settings


def register(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="write trajectories as JSON Lines",
        description="Write trajectories, one JSON object per line, oldest first "
        "(format: docs/reference/export-format.md).",
    )
    add_db(export)
    export.add_argument("--session", metavar="KEY", help="only this session key")
    export.add_argument(
        "--since", metavar="ISO8601", help="only trajectories active at or after this time"
    )
    export.add_argument(
        "--type",
        metavar="TYPE",
        dest="interaction_type",
        help="only trajectories of this interaction type (X-Onthejob-Type or auto:...)",
    )
    export.add_argument(
        "--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout"
    )
    export.set_defaults(func=cmd_export)


def _parse_since(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(f"onthejob export: --since {text!r} is not an ISO 8601 time") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def cmd_export(args: argparse.Namespace) -> int:
    from store import db
    from store.export import iter_trajectories, write_jsonl

    settings = proxy_settings(args)
    since = _parse_since(args.since) if args.since else None
    engine = db.make_engine(settings.database_url)
    try:
        rows = iter_trajectories(
            engine,
            session_key=args.session,
            since=since,
            interaction_type=args.interaction_type,
        )
        if args.output:
            with open(args.output, "wb") as out:
                count = write_jsonl(rows, out)
        else:
            count = write_jsonl(rows, sys.stdout.buffer)
    finally:
        engine.dispose()
    print(f"exported {count} trajectories", file=sys.stderr)
    return 0
