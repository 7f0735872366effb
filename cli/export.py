"""`onthejob export`: trajectories as JSON Lines (the public export format), or as Parquet
training sequences or TRL conversational rows (store/export_formats.py)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from cli.flags import add_flags, settings_from
from proxy.command_settings import ExportSettings
from store.url import database_url


def register(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="write trajectories as JSON Lines, Parquet or TRL rows",
        description="Write trajectories, oldest first (formats: docs/reference/export-format.md): "
        "one JSON object per line (jsonl), one training sequence per Parquet row with token "
        "ids, loss mask, logprobs, reward, type and versions (parquet; datasets.load_dataset "
        "reads it), or TRL's conversational prompt-completion rows (trl). Every flag can also "
        "be set as ONTHEJOB_EXPORT_<NAME>.",
    )
    add_flags(export, ExportSettings)
    export.set_defaults(func=cmd_export)


def _parse_since(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise SystemExit(f"onthejob export: --since {text!r} is not an ISO 8601 time") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def cmd_export(args: argparse.Namespace) -> int:
    from store import db
    from store.export import to_export, write_jsonl
    from store.export_formats import sample_rows, trl_rows, write_lines, write_parquet
    from store.trajectory_loading import load_trajectories

    settings = settings_from(args, ExportSettings, command="export")
    if settings.format == "parquet" and settings.output is None:
        raise SystemExit("onthejob export: --format parquet writes a file: give --output FILE")
    since = _parse_since(settings.since) if settings.since else None
    engine = db.make_engine(database_url(settings.database_url))
    try:
        trajectories = load_trajectories(
            engine,
            session_key=settings.session,
            since=since,
            interaction_type=settings.interaction_type,
        )
        if settings.format == "parquet":
            count = write_parquet(sample_rows(trajectories), settings.output)
            what = "training sequences"
        else:
            if settings.format == "trl":
                rows, write, what = trl_rows(trajectories), write_lines, "TRL rows"
            else:
                rows = (to_export(t) for t in trajectories)
                write, what = write_jsonl, "trajectories"
            if settings.output:
                with open(settings.output, "wb") as out:
                    count = write(rows, out)
            else:
                count = write(rows, sys.stdout.buffer)
    finally:
        engine.dispose()
    print(f"exported {count} {what}", file=sys.stderr)
    return 0
