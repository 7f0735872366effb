"""The learner's grading phase on a real database (no model needed)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import Engine, select

from learner import queries
from learner.config import LearnerConfig
from learner.loop import Learner
from proxy.store import repo
from proxy.store.models import Grade


def _finished(tid: str, session: str, now: float) -> dict:
    return {
        "id": tid,
        "session_key": session,
        "task_key": "task",
        "status": "finished",
        "started_at": now,
        "last_call_at": now,
    }


def test_feedback_grades_what_has_feedback_and_waits_for_the_rest(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    now = time.time()
    with engine.begin() as conn:
        repo.write_batch(
            conn, trajectories=[_finished(f"t{i}", f"s{i}", now) for i in range(3)], calls=[]
        )
        repo.finish_trajectory(conn, trajectory_id="t0", ended_at=None)
        queries.add_feedback(conn, reward=1.0, trajectory_id="t0", session_key=None, comment="good")
        queries.add_feedback(conn, reward=0.0, trajectory_id=None, session_key="s1", comment=None)
    config = LearnerConfig(
        database_url=db_url,
        model=str(tmp_path),
        graders=["feedback"],
        checkpoints=str(tmp_path / "ckpt"),
    )
    learner = Learner(config)
    try:
        assert learner.grade_finished() == 2
        assert learner.grade_finished() == 0  # t2 waits for feedback, and is not re-asked
        with engine.connect() as conn:
            grades = dict(conn.execute(select(Grade.trajectory_id, Grade.reward)).all())
        assert grades == {"t0": 1.0, "t1": 0.0}
        with engine.begin() as conn:
            queries.add_feedback(
                conn, reward=0.5, trajectory_id="t2", session_key=None, comment=None
            )
        learner._pending_since = 0.0  # the recheck interval has passed
        assert learner.grade_finished() == 1
    finally:
        learner.engine.dispose()
