"""Rewards posted for trajectories and sessions (POST /feedback, the admin API)."""

from __future__ import annotations

from sqlalchemy import Connection, select

from store.clock import now
from store.db import insert_for
from store.models import (
    Feedback,
)


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
