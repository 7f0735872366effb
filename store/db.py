"""Engines for PostgreSQL and SQLite, and the Alembic upgrade that owns the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite

import migrations


def normalise_url(url: str) -> str:
    """Use the psycopg 3 driver for plain postgres URLs (the one we install)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(url: str) -> bool:
    return normalise_url(url).startswith("sqlite")


def insert_for(conn: Connection, table: Any) -> Any:
    """An INSERT with the dialect's ON CONFLICT support (PostgreSQL or SQLite)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


def _json_dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def make_engine(url: str, *, connect_timeout: float = 3.0) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
            connect_args={"timeout": 30},
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
        pool_pre_ping=True,
        connect_args={"connect_timeout": max(1, int(connect_timeout))},
    )


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    # WAL lets the learner and export read while the proxy writes.
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def alembic_config(url: str):  # -> alembic.config.Config
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (creates it from nothing)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        return current_revision_of(engine)
    finally:
        engine.dispose()


def current_revision_of(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def revisions() -> set[str | None]:
    """Every revision this code knows, and None (a database never migrated)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return {None, *(r.revision for r in script.walk_revisions())}
