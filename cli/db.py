"""`onthejob db upgrade|current`: the store's schema (Alembic)."""

from __future__ import annotations

import argparse
from typing import Any

from cli.flags import add_db
from cli.serve import proxy_settings


def register(commands: Any) -> None:
    database = commands.add_parser("db", help="database schema (Alembic)")
    actions = database.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = actions.add_parser("upgrade", help="create or upgrade the schema to the newest")
    add_db(upgrade)
    upgrade.set_defaults(func=cmd_db_upgrade)
    current = actions.add_parser("current", help="print the schema revision")
    add_db(current)
    current.set_defaults(func=cmd_db_current)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from store import db

    settings = proxy_settings(args)
    db.upgrade(settings.database_url)
    print(f"schema at {db.current_revision(settings.database_url)}")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from store import db

    settings = proxy_settings(args)
    current = db.current_revision(settings.database_url)
    head = db.head_revision()
    print(f"{current or 'empty'} (newest: {head})")
    return 0 if current == head else 1
