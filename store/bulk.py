"""Bulk writes for the recording writer, below SQLAlchemy's per-row machinery.

PostgreSQL: COPY for rows that are new for certain (calls and trajectories of a fresh
batch), one `INSERT ... SELECT FROM unnest(...)` for trajectories that may exist, one
`UPDATE ... FROM unnest(...)` to finish many trajectories. SQLite: prepared statements run
with executemany on the raw connection. Either way a batch costs a few statements, not one
per row, and no SQL is compiled per batch.

Invariant: the rows stored are those SQLAlchemy would store (SQLite: its DATETIME text in
UTC, booleans as 0/1, JSON as text), so every reader sees no difference; SQL NULL stands
for a JSON None, which reads back as None like SQLAlchemy's JSON `null`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import orjson
from sqlalchemy import JSON, Boolean, Connection, DateTime

from store.call_rows import CallRow, FinishedRow, TrajectoryRow
from store.models import Call, Trajectory

TRAJECTORY_COLUMNS = (
    "id",
    "session_key",
    "task_key",
    "group_key",
    "interaction_type",
    "status",
    "started_at",
    "last_call_at",
    "ended_at",
)
CALL_COLUMNS = tuple(c.name for c in Call.__table__.columns)
_CALL_JSON = {c.name for c in Call.__table__.columns if isinstance(c.type, JSON)}
_CALL_TIMES = {c.name for c in Call.__table__.columns if isinstance(c.type, DateTime)}
_CALL_BOOLS = {c.name for c in Call.__table__.columns if isinstance(c.type, Boolean)}
_TRAJECTORY_TIMES = {"started_at", "last_call_at", "ended_at"}
_TRAJECTORY_TYPES = {
    c.name: "timestamptz" if isinstance(c.type, DateTime) else "varchar"
    for c in Trajectory.__table__.columns
    if c.name in TRAJECTORY_COLUMNS
}


def _datetime(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def _sqlite_datetime(epoch: float | None) -> str | None:
    """SQLAlchemy's SQLite DATETIME text for a UTC time ("2026-01-01 12:00:00.000000")."""
    if epoch is None:
        return None
    naive = datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)
    return naive.isoformat(" ", "microseconds")


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


# -- PostgreSQL ----------------------------------------------------------------------------


def pg_copy_calls(conn: Connection, calls: Sequence[CallRow]) -> None:
    values = _call_values(_datetime)
    with _raw(conn).cursor() as cursor:
        with cursor.copy(f"COPY calls ({', '.join(CALL_COLUMNS)}) FROM STDIN") as copy:
            for row in calls:
                copy.write_row(values(row))


def pg_copy_trajectories(conn: Connection, trajectories: Sequence[TrajectoryRow]) -> None:
    with _raw(conn).cursor() as cursor:
        statement = f"COPY trajectories ({', '.join(TRAJECTORY_COLUMNS)}) FROM STDIN"
        with cursor.copy(statement) as copy:
            for row in trajectories:
                copy.write_row(_trajectory_values(row, _datetime))


_PG_UPSERT = (
    f"INSERT INTO trajectories ({', '.join(TRAJECTORY_COLUMNS)}) "
    "SELECT * FROM unnest("
    + ", ".join(f"%s::{_TRAJECTORY_TYPES[name]}[]" for name in TRAJECTORY_COLUMNS)
    + ") ON CONFLICT (id) DO UPDATE SET "
    # a replayed, older batch never moves a trajectory's last call back
    "last_call_at = GREATEST(trajectories.last_call_at, EXCLUDED.last_call_at), "
    "task_key = COALESCE(trajectories.task_key, EXCLUDED.task_key), "
    "group_key = COALESCE(trajectories.group_key, EXCLUDED.group_key), "
    # the first call's type stays (a later batch of the trajectory brings the same one)
    "interaction_type = COALESCE(trajectories.interaction_type, EXCLUDED.interaction_type)"
)


def pg_upsert_trajectories(conn: Connection, trajectories: Sequence[TrajectoryRow]) -> None:
    values = [_trajectory_values(row, _datetime) for row in trajectories]
    with _raw(conn).cursor() as cursor:
        cursor.execute(_PG_UPSERT, [list(column) for column in zip(*values, strict=True)])


_PG_FINISH = (
    "UPDATE trajectories AS t SET status = 'finished', ended_at = v.ended_at "
    "FROM unnest(%s::varchar[], %s::timestamptz[]) AS v(id, ended_at) "
    "WHERE t.id = v.id AND t.status = 'open'"
)


def pg_finish(conn: Connection, finished: Sequence[FinishedRow]) -> None:
    ids = [f["id"] for f in finished]
    ended = [_datetime(f["ended_at"]) for f in finished]
    with _raw(conn).cursor() as cursor:
        cursor.execute(_PG_FINISH, [ids, ended])


# -- SQLite --------------------------------------------------------------------------------

_SQLITE_UPSERT = (
    f"INSERT INTO trajectories ({', '.join(TRAJECTORY_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in TRAJECTORY_COLUMNS)}) ON CONFLICT (id) DO UPDATE SET "
    # DATETIME text of one format compares as the times do
    "last_call_at = max(trajectories.last_call_at, excluded.last_call_at), "
    "task_key = coalesce(trajectories.task_key, excluded.task_key), "
    "group_key = coalesce(trajectories.group_key, excluded.group_key), "
    "interaction_type = coalesce(trajectories.interaction_type, excluded.interaction_type)"
)
_SQLITE_CALLS = (
    f"INSERT INTO calls ({', '.join(CALL_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in CALL_COLUMNS)}) ON CONFLICT (id) DO NOTHING"
)
_SQLITE_FINISH = (
    "UPDATE trajectories SET status = 'finished', ended_at = ? WHERE id = ? AND status = 'open'"
)


def sqlite_upsert_trajectories(conn: Connection, trajectories: Sequence[TrajectoryRow]) -> None:
    values = [_trajectory_values(row, _sqlite_datetime) for row in trajectories]
    _raw(conn).executemany(_SQLITE_UPSERT, values)


def sqlite_insert_calls(conn: Connection, calls: Sequence[CallRow]) -> None:
    values = _call_values(_sqlite_datetime, booleans=True)
    _raw(conn).executemany(_SQLITE_CALLS, [values(row) for row in calls])


def sqlite_finish(conn: Connection, finished: Sequence[FinishedRow]) -> None:
    values = [(_sqlite_datetime(f["ended_at"]), f["id"]) for f in finished]
    _raw(conn).executemany(_SQLITE_FINISH, values)


# -- shared --------------------------------------------------------------------------------


# the writer's rows have every column (proxy/recording/rows.py): one C-level lookup of all of them,
# then the few that need converting; a Python call per column cost ~20 us a call
_CALL_GETTER = itemgetter(*CALL_COLUMNS)
_CALL_JSON_AT = [i for i, name in enumerate(CALL_COLUMNS) if name in _CALL_JSON]
_CALL_TIMES_AT = [i for i, name in enumerate(CALL_COLUMNS) if name in _CALL_TIMES]
_CALL_BOOLS_AT = [i for i, name in enumerate(CALL_COLUMNS) if name in _CALL_BOOLS]
_TRAJECTORY_TIMES_AT = [i for i, name in enumerate(TRAJECTORY_COLUMNS) if name in _TRAJECTORY_TIMES]


def _call_values(
    when: Callable[[float | None], Any], *, booleans: bool = False
) -> Callable[[CallRow], list[Any]]:
    def values(row: CallRow) -> list[Any]:
        try:
            out = list(_CALL_GETTER(row))
        except KeyError:  # a row without some columns: NULL there (no SQLAlchemy defaults)
            out = [row.get(name) for name in CALL_COLUMNS]
        for i in _CALL_JSON_AT:
            out[i] = _json(out[i])
        for i in _CALL_TIMES_AT:
            out[i] = when(out[i])
        if booleans:
            for i in _CALL_BOOLS_AT:
                out[i] = None if out[i] is None else int(bool(out[i]))
        return out

    return values


def _trajectory_values(row: TrajectoryRow, when: Callable[[float | None], Any]) -> list[Any]:
    out = [row.get(name) for name in TRAJECTORY_COLUMNS]  # `new` is not among them
    for i in _TRAJECTORY_TIMES_AT:
        out[i] = when(out[i])
    return out


def _raw(conn: Connection) -> Any:
    """The DBAPI connection inside the caller's transaction."""
    return conn.connection.driver_connection
