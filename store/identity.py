"""Which store this is: an id kept in the store itself, and its URL without the secret.

The proxy says both (`GET /healthz`), so a process that must use the proxy's store (the
rollout runner) can learn it from the proxy, or tell that it was pointed at another one.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import Connection, select
from sqlalchemy.engine import make_url

from store.db import insert_for, normalise_url
from store.models import LearnerState

KEY = "store"


def ensure_store_id(conn: Connection) -> str:
    """The store's id, made (once, by whoever asks first) if it has none yet."""
    stmt = insert_for(conn, LearnerState.__table__).values(key=KEY, value={"id": uuid.uuid4().hex})
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))
    found = read_store_id(conn)
    assert found is not None
    return found


def read_store_id(conn: Connection) -> str | None:
    value = conn.execute(select(LearnerState.value).where(LearnerState.key == KEY)).scalar()
    return str(value["id"]) if isinstance(value, dict) and value.get("id") else None


def public_url(url: str) -> str:
    """`url` with its password hidden (`***`) and an SQLite file's path made absolute (the
    reader may run elsewhere than this process's working directory)."""
    parsed = make_url(normalise_url(url))
    if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
        parsed = parsed.set(database=str(Path(parsed.database).resolve()))
    return parsed.render_as_string(hide_password=True)
