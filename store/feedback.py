"""Rewards posted for trajectories and sessions (POST /feedback, the admin API)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, select, update

from store.clock import now
from store.db import insert_for
from store.json_types import JsonObject
from store.models import (
    Feedback,
    Grade,
    Trajectory,
)

_CHUNK = 500  # ids per IN (...)


def latest_feedback(
    conn: Connection, *, trajectory_id: str, session_key: str | None
) -> tuple[float, str | None] | None:
    """The newest reward posted for this trajectory (or its session)."""
    condition = Feedback.trajectory_id == trajectory_id
    if session_key is not None:
        condition = condition | (Feedback.session_key == session_key)
    row = conn.execute(
        select(Feedback.reward, Feedback.comment)
        .where(condition)
        .order_by(Feedback.created_at.desc(), Feedback.id.desc())
        .limit(1)
    ).first()
    return None if row is None else (float(row[0]), row[1])


def add_feedback(
    conn: Connection,
    *,
    reward: float,
    trajectory_id: str | None,
    session_key: str | None,
    comment: str | None,
) -> None:
    conn.execute(
        insert_for(conn, Feedback.__table__).values(
            trajectory_id=trajectory_id,
            session_key=session_key,
            reward=reward,
            comment=comment,
            created_at=now(),
        )
    )


def feedback_targets(
    conn: Connection, *, trajectory_id: str | None, session_key: str | None
) -> list[str]:
    """The trajectories a reward posted for `trajectory_id`, else for `session_key`, is for."""
    if trajectory_id is not None:
        condition = Trajectory.id == trajectory_id
    else:
        condition = Trajectory.session_key == session_key
    return [r[0] for r in conn.execute(select(Trajectory.id).where(condition))]


def correct_reward(
    conn: Connection, *, trajectory_id: str, reward: float, comment: str | None
) -> bool:
    """An operator's reward replaces the trajectory's; its grade too (the old reward kept in
    its detail) unless a step already trained on it. Whether the grade was corrected."""
    grade = conn.execute(
        select(Grade.reward, Grade.detail, Grade.trained_in_step).where(
            Grade.trajectory_id == trajectory_id
        )
    ).first()
    conn.execute(update(Trajectory).where(Trajectory.id == trajectory_id).values(reward=reward))
    if grade is None or grade.trained_in_step is not None:
        return False
    detail: JsonObject = dict(grade.detail or {})
    detail["operator"] = {"reward": reward, "comment": comment, "was": grade.reward}
    conn.execute(
        update(Grade)
        .where(Grade.trajectory_id == trajectory_id)
        .values(reward=reward, detail=detail, error=None)
    )
    return True


def latest_rewards(conn: Connection, trajectory_ids: Sequence[str]) -> dict[str, float]:
    """Per trajectory among `trajectory_ids` with a reward posted for it, the newest one."""
    latest: dict[str, float] = {}
    ids = list(trajectory_ids)
    for start in range(0, len(ids), _CHUNK):
        found = conn.execute(
            select(Feedback.trajectory_id, Feedback.reward)
            .where(Feedback.trajectory_id.in_(ids[start : start + _CHUNK]))
            .order_by(Feedback.created_at, Feedback.id)
        )
        latest.update({tid: float(reward) for tid, reward in found})  # the last one wins
    return latest
