"""`onthejob spool replay`: retry the rows the database refused, once their cause is fixed."""

from __future__ import annotations

import argparse
from typing import Any

from cli.flags import add_flags, settings_from
from proxy.command_settings import SpoolReplaySettings
from store.url import database_url


def register(commands: Any) -> None:
    spool = commands.add_parser("spool", help="rows the database refused (<spool>.rejected)")
    actions = spool.add_subparsers(dest="spool_command", required=True, metavar="ACTION")
    replay = actions.add_parser(
        "replay",
        help="write the refused rows again",
        description="Write the rows the database refused (FILE.rejected) again, e.g. after "
        "`onthejob db upgrade` or a fixed column. Rows it takes leave the file; rows it still "
        "refuses stay, with the new reason. Safe while the proxy runs. Every flag can also be set "
        "as ONTHEJOB_SPOOL_<NAME>.",
    )
    add_flags(replay, SpoolReplaySettings)
    replay.set_defaults(func=cmd_spool_replay)


def cmd_spool_replay(args: argparse.Namespace) -> int:
    from proxy.recording.recorder import rejected_path
    from proxy.recording.rejected import replay
    from proxy.recording.writer import Unreachable
    from store import db

    settings = settings_from(args, SpoolReplaySettings, command="spool replay")
    path = rejected_path(settings.path)
    engine = db.make_engine(database_url(settings.database_url))
    try:
        result = replay(engine, path)
    except Unreachable as exc:
        print(
            f"onthejob spool replay: the database is unreachable or its schema behind ({exc}); "
            "nothing lost, try again"
        )
        return 2
    finally:
        engine.dispose()
    print(f"{result.written} rows written, {result.refused} still refused")
    if result.refused:
        print(f"kept in {path}; first reason: {result.first_reason}")
        return 1
    return 0
