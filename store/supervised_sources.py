"""What the learner's supervised stage may train on (`learn --supervised-from`): finished
trajectories a grader passed, or those a teacher answered (calls.teacher), newest first."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, exists, select

from store.grade_queue import only_keys
from store.models import Call, Grade, Trajectory


def passed(
    conn: Connection, *, min_reward: float, limit: int, keys: Sequence[str] = ()
) -> list[str]:
    """Ids of finished trajectories graded with a reward of at least `min_reward` (trained
    on by a step or not: a good example stays one); with `keys`, only those keys' traffic."""
    query = (
        select(Trajectory.id)
        .join(Grade, Grade.trajectory_id == Trajectory.id)
        .where(Trajectory.status == "finished", Grade.reward >= min_reward)
        .order_by(Trajectory.last_call_at.desc(), Trajectory.id)
        .limit(limit)
    )
    if keys:
        query = query.where(only_keys(keys))
    return [r[0] for r in conn.execute(query)]


def teacher_answered(conn: Connection, *, limit: int, keys: Sequence[str] = ()) -> list[str]:
    """Ids of finished trajectories a call of which a teacher answered, graded or not."""
    query = (
        select(Trajectory.id)
        .where(Trajectory.status == "finished")
        .where(exists().where(Call.trajectory_id == Trajectory.id, Call.teacher.is_not(None)))
        .order_by(Trajectory.last_call_at.desc(), Trajectory.id)
        .limit(limit)
    )
    if keys:
        query = query.where(only_keys(keys))
    return [r[0] for r in conn.execute(query)]
