"""Which database errors mean the store is away (retry later, keep the data) rather than
refusing the data: the proxy's writer holds its rows through the first kind."""

from __future__ import annotations

import sqlite3

import psycopg
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

# a table or column the rows need is missing: the schema is behind (or was taken back), the
# rows are fine; they wait until it is upgraded instead of being refused one by one
_SCHEMA_BEHIND = psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn


def is_unreachable(exc: BaseException) -> bool:
    """Connection-level failures and a schema that is behind; anything else is about the
    data being written."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig or exc
    # raw driver errors come from the bulk paths (store/bulk.py); SQLite's operational
    # errors are a missing table or column, or a lock held past the busy timeout
    unreachable = psycopg.OperationalError | psycopg.InterfaceError | sqlite3.OperationalError
    return isinstance(exc, unreachable | OSError | _SCHEMA_BEHIND)
