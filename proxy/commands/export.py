"""`onthejob export`: trajectories as JSON Lines (the public export format), or as Parquet
training sequences or TRL conversational rows (store/export_formats.py)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.commands import add_db, proxy_settings
from store.export_formats import FORMATS


def register(commands: Any) -> None:
    export = commands.add_parser(
        "export",
        help="write trajectories as JSON Lines, Parquet or TRL rows",
        description="Write trajectories, oldest first (formats: docs/reference/export-format.md): "
        "one JSON object per line (jsonl), one training sequence per Parquet row with token "
        "ids, loss mask, logprobs, reward, type and versions (parquet; datasets.load_dataset "
        "reads it), or TRL's conversational prompt-completion rows (trl).",
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
        "--format",
        choices=FORMATS,
        default="jsonl",
        help="jsonl (the export format, default), parquet (needs --output and "
        "`pip install 'onthejob[export]'`) or trl",
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
    from store.export import to_export, write_jsonl
    from store.export_formats import sample_rows, trl_rows, write_lines, write_parquet
    from store.trajectory_loading import load_trajectories

    if args.format == "parquet" and args.output is None:
        raise SystemExit("onthejob export: --format parquet writes a file: give --output FILE")
    settings = proxy_settings(args)
    since = _parse_since(args.since) if args.since else None
    engine = db.make_engine(settings.database_url)
    try:
        trajectories = load_trajectories(
            engine,
            session_key=args.session,
            since=since,
            interaction_type=args.interaction_type,
        )
        if args.format == "parquet":
            count = write_parquet(sample_rows(trajectories), args.output)
            what = "training sequences"
        else:
            if args.format == "trl":
                rows, write, what = trl_rows(trajectories), write_lines, "TRL rows"
            else:
                rows = (to_export(t) for t in trajectories)
                write, what = write_jsonl, "trajectories"
            if args.output:
                with open(args.output, "wb") as out:
                    count = write(rows, out)
            else:
                count = write(rows, sys.stdout.buffer)
    finally:
        engine.dispose()
    print(f"exported {count} {what}", file=sys.stderr)
    return 0
