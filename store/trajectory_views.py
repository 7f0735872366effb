"""The admin API's trajectory views: filtered lists in pages, ids to export, a grade and
the feedback given (proxy/admin/routes/trajectories.py serves them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Protocol, TypedDict
from typing import cast as typed

from sqlalchemy import Connection, Select, Text, and_, cast, exists, or_, select

from store.clock import iso
from store.json_types import JsonObject
from store.models import Call, Feedback, Grade, Trajectory


class TrajectoryConditions(Protocol):
    """Which trajectories (the admin API's TrajectoryFilter): every condition not None
    must hold."""

    session: str | None
    task_key: str | None
    type: str | None
    status: str | None
    policy_version: str | None
    min_reward: float | None
    max_reward: float | None
    graded: bool | None
    grading: Literal["failed", "retrying"] | None
    since: datetime | None
    until: datetime | None
    q: str | None


class GradingFailure(TypedDict):
    state: Literal["retrying", "failed"]
    error: str | None
    retry_at: str | None


class TrajectorySummary(TypedDict):
    """A trajectory in a list page."""

    id: str
    session: str | None
    task_key: str | None
    group_key: str | None
    interaction_type: str | None
    status: str
    reward: float | None
    started_at: str | None
    last_call_at: str | None
    ended_at: str | None
    calls: int
    errors: int
    completion_tokens: int
    policy_versions: list[str | None]
    grading_failure: GradingFailure | None


class GradeView(TypedDict):
    """A trajectory's grade row, its times as the admin API gives them."""

    trajectory_id: str
    reward: float | None
    detail: JsonObject | None
    error: str | None
    graded_at: str | None
    trained_in_step: int | None
    transient: bool
    retry_at: str | None
    attempts: int


class FeedbackView(TypedDict):
    id: int
    trajectory_id: str | None
    reward: float
    comment: str | None
    created_at: str | None
    session: str | None  # the column session_key


class _ListRow(TypedDict):
    """LIST_COLUMNS."""

    id: str
    session_key: str | None
    task_key: str | None
    group_key: str | None
    interaction_type: str | None
    status: str
    started_at: datetime
    last_call_at: datetime
    ended_at: datetime | None
    reward: float | None


class _CallCounts(TypedDict, total=False):
    calls: int
    errors: int
    completion_tokens: int
    versions: list[str | None]


LIST_COLUMNS = (
    Trajectory.id,
    Trajectory.session_key,
    Trajectory.task_key,
    Trajectory.group_key,
    Trajectory.interaction_type,
    Trajectory.status,
    Trajectory.started_at,
    Trajectory.last_call_at,
    Trajectory.ended_at,
    Trajectory.reward,
)


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def filtered(query: Select[Any], f: TrajectoryConditions) -> Select[Any]:
    """`query` (over trajectories) narrowed by every condition of `f`."""
    if f.session is not None:
        query = query.where(Trajectory.session_key == f.session)
    if f.task_key is not None:
        query = query.where(Trajectory.task_key == f.task_key)
    if f.type is not None:
        query = query.where(Trajectory.interaction_type == f.type)
    if f.status is not None:
        query = query.where(Trajectory.status == f.status)
    if f.min_reward is not None:
        query = query.where(Trajectory.reward >= f.min_reward)
    if f.max_reward is not None:
        query = query.where(Trajectory.reward <= f.max_reward)
    if f.graded is not None:
        has_reward = Trajectory.reward.is_not(None)
        query = query.where(has_reward if f.graded else Trajectory.reward.is_(None))
    if f.grading is not None:
        query = query.where(
            exists().where(
                Grade.trajectory_id == Trajectory.id,
                Grade.error.is_not(None),
                Grade.transient.is_(f.grading == "retrying"),
            )
        )
    if f.since is not None:
        query = query.where(Trajectory.started_at >= f.since)
    if f.until is not None:
        query = query.where(Trajectory.started_at < f.until)
    if f.policy_version is not None:
        query = query.where(
            exists().where(
                Call.trajectory_id == Trajectory.id, Call.policy_version == f.policy_version
            )
        )
    if f.q is not None:
        # the request as stored JSON text: messages, prompt, input, system, tool results
        query = query.where(
            exists().where(
                Call.trajectory_id == Trajectory.id,
                cast(Call.request, Text).ilike(_like(f.q), escape="\\"),
            )
        )
    return query


def list_page(
    conn: Connection,
    *,
    f: TrajectoryConditions,
    limit: int,
    after: tuple[datetime, str] | None = None,
) -> tuple[list[TrajectorySummary], tuple[datetime, str] | None]:
    """Summaries of the newest `limit` matching trajectories started before `after`
    (started_at, id: the last one of the previous page), and the next page's `after`
    (None: this is the last page)."""
    query = filtered(select(*LIST_COLUMNS), f)
    if after is not None:
        when, last_id = after
        query = query.where(
            or_(
                Trajectory.started_at < when,
                and_(Trajectory.started_at == when, Trajectory.id < last_id),
            )
        )
    query = query.order_by(Trajectory.started_at.desc(), Trajectory.id.desc()).limit(limit + 1)
    rows = [typed(_ListRow, dict(r._mapping)) for r in conn.execute(query)]
    more = len(rows) > limit
    rows = rows[:limit]
    counts = _call_counts(conn, [r["id"] for r in rows])
    failures = _grading_failures(conn, [r["id"] for r in rows])
    items = [_summary(r, counts.get(r["id"], {}), failures.get(r["id"])) for r in rows]
    return items, (rows[-1]["started_at"], rows[-1]["id"]) if more else None


def _call_counts(conn: Connection, ids: list[str]) -> dict[str, _CallCounts]:
    if not ids:
        return {}
    out: dict[str, _CallCounts] = {}
    rows = conn.execute(
        select(Call.trajectory_id, Call.policy_version, Call.status, Call.completion_tokens)
        .where(Call.trajectory_id.in_(ids))
        .order_by(Call.started_at)
    )
    for trajectory_id, version, status, tokens in rows:
        entry = out.setdefault(
            trajectory_id, {"calls": 0, "errors": 0, "completion_tokens": 0, "versions": []}
        )
        entry["calls"] += 1
        entry["errors"] += status != "ok"
        entry["completion_tokens"] += tokens or 0
        if version not in entry["versions"]:
            entry["versions"].append(version)
    return out


def _grading_failures(conn: Connection, ids: list[str]) -> dict[str, GradingFailure]:
    """Why the grading of these trajectories failed, where it did."""
    if not ids:
        return {}
    rows = conn.execute(
        select(Grade.trajectory_id, Grade.error, Grade.transient, Grade.retry_at).where(
            Grade.trajectory_id.in_(ids), Grade.error.is_not(None)
        )
    )
    return {
        trajectory_id: {
            "state": "retrying" if transient else "failed",
            "error": error,
            "retry_at": iso(retry_at),
        }
        for trajectory_id, error, transient, retry_at in rows
    }


def _summary(
    row: _ListRow, counts: _CallCounts, failure: GradingFailure | None = None
) -> TrajectorySummary:
    return {
        "id": row["id"],
        "session": row["session_key"],
        "task_key": row["task_key"],
        "group_key": row["group_key"],
        "interaction_type": row["interaction_type"],
        "status": row["status"],
        "reward": row["reward"],
        "started_at": iso(row["started_at"]),
        "last_call_at": iso(row["last_call_at"]),
        "ended_at": iso(row["ended_at"]),
        "calls": counts.get("calls", 0),
        "errors": counts.get("errors", 0),
        "completion_tokens": counts.get("completion_tokens", 0),
        "policy_versions": counts.get("versions", []),
        # null, or {"state": "retrying" | "failed", "error", "retry_at"}
        "grading_failure": failure,
    }


def matching_ids(conn: Connection, *, f: TrajectoryConditions) -> list[str]:
    """Every matching id, oldest first (the export's order)."""
    query = filtered(select(Trajectory.id), f).order_by(Trajectory.started_at, Trajectory.id)
    return [r[0] for r in conn.execute(query)]


def grade_of(conn: Connection, *, trajectory_id: str) -> GradeView | None:
    row = conn.execute(select(Grade.__table__).where(Grade.trajectory_id == trajectory_id)).first()
    if row is None:
        return None
    grade = dict(row._mapping)
    grade["graded_at"] = iso(grade["graded_at"])
    grade["retry_at"] = iso(grade["retry_at"])
    return typed(GradeView, grade)


def feedback_for(
    conn: Connection, *, trajectory_id: str | None, session_key: str | None, limit: int = 100
) -> list[FeedbackView]:
    conditions = []
    if trajectory_id is not None:
        conditions.append(Feedback.trajectory_id == trajectory_id)
    if session_key is not None:
        conditions.append(Feedback.session_key == session_key)
    query = select(Feedback.__table__).order_by(Feedback.created_at.desc(), Feedback.id.desc())
    if conditions:
        query = query.where(or_(*conditions))
    rows = [dict(r._mapping) for r in conn.execute(query.limit(limit))]
    for row in rows:
        row["created_at"] = iso(row["created_at"])
        row["session"] = row.pop("session_key")
    return typed(list[FeedbackView], rows)


def exists_trajectory(conn: Connection, *, trajectory_id: str) -> bool:
    found = conn.execute(select(Trajectory.id).where(Trajectory.id == trajectory_id)).first()
    return found is not None
