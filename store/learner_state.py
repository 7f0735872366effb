"""The learner's small key/value state (baselines, knobs, heartbeat, guard records)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from store.db import insert_for
from store.models import (
    LearnerState,
)


def get_state(conn: Connection, key: str) -> Any:
    return conn.execute(select(LearnerState.value).where(LearnerState.key == key)).scalar()


def set_state(conn: Connection, key: str, value: Any) -> None:
    stmt = insert_for(conn, LearnerState.__table__).values(key=key, value=value)
    conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": value}))
