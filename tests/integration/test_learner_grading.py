"""The learner's grading phase on a real database (no model needed)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from learner.config import LearnerConfig
from learner.loop import Learner
from learner.loop import grading as loop_grading
from store import grade_queue, policy_versions, recording, training_steps
from store.feedback import add_feedback
from store.models import Grade
from tests.support import sample_rewards
from tests.support.drills import wait_until
from tests.support.records import served_calls


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
        recording.write_batch(
            conn, trajectories=[_finished(f"t{i}", f"s{i}", now) for i in range(3)], calls=[]
        )
        recording.finish_trajectory(conn, trajectory_id="t0", ended_at=None)
        add_feedback(conn, reward=1.0, trajectory_id="t0", session_key=None, comment="good")
        add_feedback(conn, reward=0.0, trajectory_id=None, session_key="s1", comment=None)
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
            add_feedback(conn, reward=0.5, trajectory_id="t2", session_key=None, comment=None)
        learner.grading.pending_since = 0.0  # the recheck interval has passed
        assert learner.grade_finished() == 1
    finally:
        learner.state.engine.dispose()


def _learner(db_url: str, tmp_path: Path, grader: str, **extra: Any) -> Learner:
    config = LearnerConfig(
        database_url=db_url,
        model=str(tmp_path),
        graders=[grader],
        checkpoints=str(tmp_path / "ckpt"),
        **extra,
    )
    return Learner(config)


def _grades(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(select(Grade.__table__)).mappings().all()
    return {r["trajectory_id"]: r for r in rows}


def test_a_transient_failure_is_graded_again_with_back_off_then_gives_up(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    now = time.time()
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=[_finished("t0", "s0", now)], calls=[])
    sample_rewards.SERVICE_UP["up"] = False
    learner = _learner(
        db_url,
        tmp_path,
        "python:tests.support.sample_rewards:flaky",
        # long enough that two looks in a row fall inside it on a loaded host (0.2 s did not)
        grade_retry_base=1.0,
        grade_max_attempts=3,
    )
    try:
        assert learner.grade_finished() == 1
        first = _grades(engine)["t0"]
        assert first["transient"] and first["reward"] is None and first["attempts"] == 1
        assert "reward service is down" in first["error"]
        assert learner.grade_finished() == 0  # not before its retry is due
        wait_until(lambda: learner.grade_finished() == 1, "the second try")
        assert _grades(engine)["t0"]["attempts"] == 2
        # the service comes back: the next try grades it, and it can be trained on
        sample_rewards.SERVICE_UP["up"] = True
        wait_until(lambda: learner.grade_finished() == 1, "the third try")
        graded = _grades(engine)["t0"]
        assert graded["reward"] == 0.75 and graded["error"] is None and not graded["transient"]
        with engine.connect() as conn:
            assert [r["trajectory_id"] for r in grade_queue.trainable_grades(conn)] == ["t0"]

        # a trajectory whose every try fails: permanent after the last one
        sample_rewards.SERVICE_UP["up"] = False
        with engine.begin() as conn:
            recording.write_batch(conn, trajectories=[_finished("t1", "s1", now)], calls=[])
        assert learner.grade_finished() == 1
        wait_until(
            lambda: learner.grade_finished() == 0 and _grades(engine)["t1"]["attempts"] == 3,
            "three tries",
        )
        given_up = _grades(engine)["t1"]
        assert not given_up["transient"] and given_up["error"].startswith("gave up after 3 tries")
        with engine.connect() as conn:
            assert grade_queue.grading_failures(conn) == {"retrying": 0, "failed": 1}
            assert grade_queue.ungraded_finished(conn, limit=10) == []
    finally:
        sample_rewards.SERVICE_UP["up"] = False
        learner.state.engine.dispose()


def test_the_newest_are_graded_first_and_the_too_stale_not_at_all(
    db_url: str, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    served = {  # trajectory: the versions that served its calls, oldest call first
        "old": ["v1", "v5"],  # its first call is 4 versions old: too stale at 2
        "edge": ["v3"],  # 2 versions old: still trainable
        "unknown": ["not-verified"],  # no verified version: graded, as before
        "new": ["v5"],
    }
    with engine.begin() as conn:
        for ordinal in range(6):
            parent = f"v{ordinal - 1}" if ordinal else None
            policy_versions.add_version(
                conn, version=f"v{ordinal}", ordinal=ordinal, parent=parent,
                checkpoint_path=None, status="serving",
            )  # fmt: skip
        trajectories, calls = [], []
        for i, (tid, versions) in enumerate(served.items()):
            at = now + 10 * i  # finished in this order: "new" last
            trajectories.append({**_finished(tid, f"s-{tid}", at), "last_call_at": at + 1})
            calls += served_calls(tid, versions, at)
        recording.write_batch(conn, trajectories=trajectories, calls=calls)
    sample_rewards.SEEN.clear()
    grader = "python:tests.support.sample_rewards:recorded"
    learner = _learner(db_url, tmp_path, grader, max_staleness=2)
    monkeypatch.setattr(loop_grading, "GRADE_BATCH", 1)
    try:
        # the too stale one is recorded without a grader call, then the newest is graded
        assert learner.grade_finished() == 2
        assert sample_rewards.SEEN == ["new"]
        assert learner.grade_finished() == 1 and learner.grade_finished() == 1
        assert sample_rewards.SEEN == ["new", "unknown", "edge"]
        assert learner.grade_finished() == 0
        skipped = _grades(engine)["old"]
        assert skipped["reward"] is None and skipped["error"] is None
        assert skipped["detail"] == {
            "not_graded": "stale",
            "serving_ordinal": 5,
            "max_staleness": 2,
        }
        with engine.connect() as conn:
            # neither a failure nor waiting to be graded or trained: counted by the next step
            assert grade_queue.grading_failures(conn) == {"retrying": 0, "failed": 0}
            assert grade_queue.count_ungraded_finished(conn) == 0
            trainable = {r["trajectory_id"] for r in grade_queue.trainable_grades(conn)}
            assert trainable == {"new", "unknown", "edge"}
            assert grade_queue.stale_skipped(conn) == ["old"]
            assert grade_queue.stale_skipped(conn, keys=["someone"]) == []
        with engine.begin() as conn:
            grade_queue.mark_trained(conn, trajectory_ids=["old"], step=1)
            assert grade_queue.stale_skipped(conn) == []
    finally:
        learner.state.engine.dispose()


def test_regrade_grades_the_failed_ones_again_and_leaves_trained_ones(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    now = time.time()
    with engine.begin() as conn:
        recording.write_batch(
            conn, trajectories=[_finished(f"t{i}", f"s{i}", now) for i in range(3)], calls=[]
        )
    broken = "python:tests.support.sample_rewards:explodes"
    learner = _learner(db_url, tmp_path, broken)
    try:
        assert learner.grade_finished() == 3
    finally:
        learner.state.engine.dispose()
    with engine.begin() as conn:
        assert grade_queue.grading_failures(conn) == {"retrying": 0, "failed": 3}
        grade_queue.mark_trained(conn, trajectory_ids=["t2"], step=1)  # as if a step used it
        training_steps.add_step(conn, step=1, version=None, metrics={})
    fixed = "python:tests.support.sample_rewards:is_finished"
    regrade = [sys.executable, "-m", "cli", "regrade", "--db", db_url]
    run = subprocess.run(
        [*regrade, "--failed", "--grader", fixed],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "regraded 2: 2 rewarded, 0 to be tried again, 0 failed" in run.stdout
    assert "1 left as they were (trained on already)" in run.stdout
    grades = _grades(engine)
    assert grades["t0"]["reward"] == 1.0 and grades["t0"]["error"] is None
    assert grades["t2"]["error"] is not None  # a step trained on it: unchanged
    nothing = subprocess.run(
        [*regrade, "--grader", fixed],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nothing.returncode != 0 and "say which trajectories" in nothing.stderr
