"""Which database: the one resolver every process uses.

An explicit URL (a `--db` flag, a settings field) wins, then $ONTHEJOB_DATABASE_URL, then
SQLite in the working directory, the embedded default.
"""

from __future__ import annotations

from typing import Any

from store.environment import environment
from store.settings_fields import setting

DATABASE_URL_ENV = "ONTHEJOB_DATABASE_URL"
DEFAULT_SQLITE_URL = "sqlite:///onthejob.db"
DB_HELP = (
    "database URL (postgresql://... or sqlite:///file.db); default: "
    f"${DATABASE_URL_ENV}, else {DEFAULT_SQLITE_URL} in the working directory"
)


def given_database_url(explicit: str | None = None) -> str | None:
    """The URL given (the flag, else the environment), or None: the caller's own default."""
    return explicit or environment().database_url or None


def database_url(explicit: str | None = None) -> str:
    return given_database_url(explicit) or DEFAULT_SQLITE_URL


def database_setting() -> Any:
    """The `--db` setting of a command's settings class: None resolves as ``database_url``."""
    return setting(None, DB_HELP, flag="--db", metavar="URL")
