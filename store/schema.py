"""Who may change the schema: only `onthejob db upgrade`, or a process started with --migrate.

Every process (proxy, learner, rollout runner, regrade) opens the store through ``prepare``:
a schema that is behind this code stops it with what to run, so a newer learner never
migrates the database under older proxies. The one exception is a new SQLite file, never
migrated: it gets its schema (the zero-set-up default), since nothing older can be using it.
"""

from __future__ import annotations

import logging

from sqlalchemy import make_url
from sqlalchemy.exc import SQLAlchemyError

from store import db

log = logging.getLogger("onthejob.schema")


class SchemaBehind(RuntimeError):
    """The database's schema is not the one this code writes: it must not use it."""


def prepare(url: str, *, migrate: bool, auto_migrate: bool = True, who: str = "onthejob") -> bool:
    """Create a new SQLite database's schema (``auto_migrate``), upgrade any schema when told
    to (``migrate``), and otherwise raise SchemaBehind for a schema behind (or ahead of) this
    code, on SQLite as on PostgreSQL. False when the database could not be reached (the
    caller decides whether to wait for it)."""
    try:
        current, head = db.current_revision(url), db.head_revision()
        fresh = current is None and auto_migrate and db.is_sqlite(url)
        if current != head and current in db.revisions() and (migrate or fresh):
            db.upgrade(url)
            return True
    except SQLAlchemyError as exc:
        log.warning("database unreachable at start (%s)", exc)
        return False
    if current == head:
        return True
    if current not in db.revisions():
        raise SchemaBehind(
            f"the database schema is at {current}, newer than this {who} (it knows up to "
            f"{head}): run the onthejob release that migrated it"
        )
    raise SchemaBehind(
        f"the database schema is at {current or 'nothing (never migrated)'}, this {who} "
        f"needs {head}: run `onthejob db upgrade --db URL` first, or start it with --migrate "
        "to let it upgrade the schema itself"
    )


def require(url: str, *, migrate: bool, who: str) -> None:
    """``prepare`` for a process that cannot start without its store (learner, rollout
    runner, regrade): an unreachable database stops it too."""
    if not prepare(url, migrate=migrate, who=who):
        shown = make_url(url).render_as_string(hide_password=True)
        raise SchemaBehind(f"cannot reach the database {shown} to check its schema")
