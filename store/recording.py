"""Queries over calls and trajectories. Callers own the transaction (pass a Connection)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, case, func, select, update

from store import bulk
from store.call_rows import (
    CallRow,
    FinishedRow,
    OpenTrajectory,
    ResponseRow,
    StoredCall,
    StoredResponseRow,
    StoredTrajectory,
    TrajectoryRow,
)
from store.db import insert_for
from store.models import Call, StoredResponse, Trajectory

CALL_TIME_FIELDS = ("started_at",)
TRAJECTORY_TIME_FIELDS = ("started_at", "last_call_at", "ended_at")

_Row = TypeVar("_Row", CallRow, TrajectoryRow, ResponseRow)


def to_datetime(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def _with_datetimes(rows: Sequence[_Row], fields: Sequence[str]) -> list[dict[str, Any]]:
    """SQLAlchemy's parameters for the rows: their epoch seconds become datetimes."""
    out = []
    for row in rows:
        row = dict(row)
        for name in fields:
            if name in row:
                row[name] = to_datetime(row[name])
        out.append(row)
    return out


def write_batch(
    conn: Connection,
    *,
    trajectories: Sequence[TrajectoryRow],
    calls: Sequence[CallRow],
    finished: Sequence[FinishedRow] = (),
    responses: Sequence[ResponseRow] = (),
    fresh: bool = False,
) -> None:
    """Insert a batch idempotently: replaying the same batch changes nothing.

    `fresh` batches (built by the writer, never written before) take the bulk paths
    (store/bulk.py: COPY on PostgreSQL for what is new, prepared statements on
    SQLite); a batch that might be in already, or rows from elsewhere (a replay, the
    rejected file), take SQLAlchemy's, which also fills in column defaults.
    Timestamps arrive as epoch seconds (the call log keeps them that way).
    """
    if fresh:
        _write_fresh(conn, trajectories, calls)
    else:
        _write_any(conn, trajectories, calls)
    if responses:
        stmt = insert_for(conn, StoredResponse.__table__).on_conflict_do_nothing(
            index_elements=["id"]
        )
        conn.execute(stmt, _with_datetimes(responses, ("created_at",)))
    finish_trajectories(conn, finished=finished)


def _write_fresh(
    conn: Connection, trajectories: Sequence[TrajectoryRow], calls: Sequence[CallRow]
) -> None:
    if conn.dialect.name == "postgresql":
        new = [t for t in trajectories if t.get("new")]
        known = [t for t in trajectories if not t.get("new")]
        if new:
            bulk.pg_copy_trajectories(conn, new)
        if known:
            bulk.pg_upsert_trajectories(conn, known)
        if calls:
            bulk.pg_copy_calls(conn, calls)
        return
    if trajectories:
        bulk.sqlite_upsert_trajectories(conn, trajectories)
    if calls:
        bulk.sqlite_insert_calls(conn, calls)


def _write_any(
    conn: Connection, trajectories: Sequence[TrajectoryRow], calls: Sequence[CallRow]
) -> None:
    trajectories = [_without_new(t) for t in trajectories]
    if trajectories:
        table = Trajectory.__table__
        stmt = insert_for(conn, table)
        newer = stmt.excluded.last_call_at > table.c.last_call_at
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c.id],
            set_={
                "last_call_at": case(
                    (newer, stmt.excluded.last_call_at), else_=table.c.last_call_at
                ),
                "task_key": func.coalesce(table.c.task_key, stmt.excluded.task_key),
                "group_key": func.coalesce(table.c.group_key, stmt.excluded.group_key),
                "interaction_type": func.coalesce(
                    table.c.interaction_type, stmt.excluded.interaction_type
                ),
            },
        )
        conn.execute(stmt, _with_datetimes(trajectories, TRAJECTORY_TIME_FIELDS))
    if calls:
        stmt = insert_for(conn, Call.__table__).on_conflict_do_nothing(index_elements=["id"])
        conn.execute(stmt, _with_datetimes(calls, CALL_TIME_FIELDS))


def _without_new(trajectory: TrajectoryRow) -> TrajectoryRow:
    """A trajectory row without the writer's `new` flag (not a column)."""
    if "new" not in trajectory:
        return trajectory
    return cast(TrajectoryRow, {k: v for k, v in trajectory.items() if k != "new"})


def finish_trajectory(conn: Connection, *, trajectory_id: str, ended_at: datetime | None) -> None:
    conn.execute(
        update(Trajectory)
        .where(Trajectory.id == trajectory_id, Trajectory.status == "open")
        .values(status="finished", ended_at=ended_at)
    )


def finish_trajectories(conn: Connection, *, finished: Sequence[FinishedRow]) -> None:
    """Finish open trajectories: [{"id", "ended_at" (epoch seconds)}], in one statement."""
    if not finished:
        return
    if conn.dialect.name == "postgresql":
        bulk.pg_finish(conn, finished)
    else:
        bulk.sqlite_finish(conn, finished)


def existing_call_ids(conn: Connection, *, ids: Sequence[str]) -> set[str]:
    """Which of these call ids the database holds already."""
    present: set[str] = set()
    for start in range(0, len(ids), 1000):
        chunk = list(ids[start : start + 1000])
        present.update(conn.execute(select(Call.id).where(Call.id.in_(chunk))).scalars())
    return present


def open_trajectories_for_sessions(
    conn: Connection, *, session_keys: Sequence[str]
) -> dict[str, OpenTrajectory]:
    """The newest open trajectory of each session key that has one."""
    found: dict[str, OpenTrajectory] = {}
    for start in range(0, len(session_keys), 1000):
        chunk = list(session_keys[start : start + 1000])
        rows = conn.execute(
            select(
                Trajectory.id,
                Trajectory.session_key,
                Trajectory.started_at,
                Trajectory.last_call_at,
            ).where(Trajectory.session_key.in_(chunk), Trajectory.status == "open")
        )
        for row in rows:
            best = found.get(row.session_key)
            if best is None or _naive(row.last_call_at) > _naive(best["last_call_at"]):
                found[row.session_key] = cast(OpenTrajectory, dict(row._mapping))
    return found


def _naive(value: datetime) -> datetime:
    return value.replace(tzinfo=None) if value.tzinfo is not None else value


def finish_idle(conn: Connection, *, idle_before: datetime) -> int:
    """Finish open trajectories whose last call is older than `idle_before`; how many."""
    result = conn.execute(
        update(Trajectory)
        .where(Trajectory.status == "open", Trajectory.last_call_at < idle_before)
        .values(status="finished", ended_at=Trajectory.last_call_at)
    )
    return result.rowcount or 0


def open_trajectory_for_session(conn: Connection, *, session_key: str) -> OpenTrajectory | None:
    row = conn.execute(
        select(Trajectory.id, Trajectory.started_at, Trajectory.last_call_at)
        .where(Trajectory.session_key == session_key, Trajectory.status == "open")
        .order_by(Trajectory.last_call_at.desc())
        .limit(1)
    ).first()
    return None if row is None else cast(OpenTrajectory, dict(row._mapping))


def trajectories(
    conn: Connection,
    *,
    session_key: str | None = None,
    since: datetime | None = None,
    status: str | None = None,
    ids: list[str] | None = None,
    interaction_type: str | None = None,
) -> Iterator[StoredTrajectory]:
    """Trajectories (as dicts) oldest first; `since` matches any activity after it."""
    query = select(Trajectory.__table__).order_by(Trajectory.started_at, Trajectory.id)
    if session_key is not None:
        query = query.where(Trajectory.session_key == session_key)
    if since is not None:
        query = query.where(Trajectory.last_call_at >= since)
    if status is not None:
        query = query.where(Trajectory.status == status)
    if ids is not None:
        query = query.where(Trajectory.id.in_(ids))
    if interaction_type is not None:
        query = query.where(Trajectory.interaction_type == interaction_type)
    for row in conn.execute(query).yield_per(200):
        yield cast(StoredTrajectory, dict(row._mapping))


def calls_of(conn: Connection, *, trajectory_id: str) -> list[StoredCall]:
    rows = conn.execute(
        select(Call.__table__)
        .where(Call.trajectory_id == trajectory_id)
        .order_by(Call.started_at, Call.id)
    )
    return [cast(StoredCall, dict(r._mapping)) for r in rows]


def call_by_id(conn: Connection, *, call_id: str) -> StoredCall | None:
    row = conn.execute(select(Call.__table__).where(Call.id == call_id)).first()
    return None if row is None else cast(StoredCall, dict(row._mapping))


def calls_by_ids(conn: Connection, *, ids: Sequence[str]) -> dict[str, StoredCall]:
    """The calls of these ids that the store has, by id (in chunks: bounded statements)."""
    found: dict[str, StoredCall] = {}
    ids = list(ids)
    for start in range(0, len(ids), 500):
        rows = conn.execute(select(Call.__table__).where(Call.id.in_(ids[start : start + 500])))
        found.update((r.id, cast(StoredCall, dict(r._mapping))) for r in rows)
    return found


def stored_response(conn: Connection, *, response_id: str) -> StoredResponseRow | None:
    row = conn.execute(
        select(StoredResponse.__table__).where(StoredResponse.id == response_id)
    ).first()
    return None if row is None else cast(StoredResponseRow, dict(row._mapping))
