"""A call a teacher answered (`serve --teacher-url`): its `teacher` column (migration 0022)
is written, read back into the trajectory record and exported, on both databases."""

from __future__ import annotations

import time

from alembic import command
from sqlalchemy import Engine, inspect

from store import db, recording
from store.export import to_export
from store.trajectory_loading import load_trajectories
from tests.support.store_rows import call_batch


def test_a_teacher_call_comes_back_marked_and_without_a_policy_version(engine: Engine) -> None:
    batch = call_batch(time.time())
    call = batch["calls"][0]
    # a hosted teacher: its text, no tokens
    call.update(
        teacher="big-model",
        policy_version=None,
        upstream="https://teacher.example",
        prompt_token_suffix=None,
        prompt_len=None,
        choices=None,
        capture_complete=False,
    )
    with engine.begin() as conn:
        recording.write_batch(conn, **batch)
    (trajectory,) = load_trajectories(engine)
    (loaded,) = trajectory.calls
    assert loaded.teacher == "big-model" and loaded.policy_version is None
    assert loaded.prompt_token_ids is None and loaded.completion_token_ids is None
    exported = to_export(trajectory)["calls"][0]
    assert exported["teacher"] == "big-model" and exported["capture_complete"] is False


def test_a_policy_call_has_no_teacher(engine: Engine) -> None:
    with engine.begin() as conn:
        recording.write_batch(conn, **call_batch(time.time()))  # written without the column
    (trajectory,) = load_trajectories(engine)
    assert trajectory.calls[0].teacher is None
    assert to_export(trajectory)["calls"][0]["teacher"] is None


def test_migration_0022_adds_and_drops_the_column(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        assert "teacher" in {c["name"] for c in inspect(engine).get_columns("calls")}
        command.downgrade(db.alembic_config(db_url), "0021")
        engine.dispose()
        assert "teacher" not in {c["name"] for c in inspect(engine).get_columns("calls")}
        db.upgrade(db_url)
        engine.dispose()
        assert "teacher" in {c["name"] for c in inspect(engine).get_columns("calls")}
    finally:
        engine.dispose()
