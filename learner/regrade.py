"""`onthejob regrade`: grade a chosen set of trajectories again, now, with the graders given
(the learner's settings: --grader, --tasks, --config, ONTHEJOB_LEARN_*).

What can be regraded: finished trajectories no step has trained on (what a step trained on
stays as it was), except rollout runs (their runner grades them). The results are stored as
the learner stores its own (learner/grading.py): a transient failure is tried again by the
learner later, a trajectory waiting for feedback keeps waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from learner import grading
from learner.config import LearnerConfig
from learner.signals import SignalWeights
from store import db, grade_queue, schema
from store.tasks import TaskTable, task_table
from store.trajectory_loading import load_trajectories

BATCH = 256


@dataclass(frozen=True)
class Selection:
    failed_only: bool = False  # only those whose grading failed
    session_key: str | None = None
    task_key: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    ids: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.failed_only
            or self.session_key
            or self.task_key
            or self.since
            or self.until
            or self.ids
        )


@dataclass
class Report:
    outcome: grading.Outcome
    skipped_trained: int  # matched, but a step trained on them already


def regrade(config: LearnerConfig, selection: Selection) -> Report:
    if selection.empty:
        raise ValueError(
            "say which trajectories: --failed, --session, --task, --since, --until or --trajectory"
        )
    schema.require(config.database_url, migrate=config.migrate, who="regrade")
    engine = db.make_engine(config.database_url)
    try:
        grader = grading.learner_grader(config, engine)
        policy = grading.RetryPolicy(
            base=config.grade_retry_base,
            cap=config.grade_retry_cap,
            max_attempts=config.grade_max_attempts,
        )
        tasks = _tasks(engine, config.tasks)
        with engine.connect() as conn:
            ids, trained = grade_queue.regrade_candidates(
                conn,
                failed_only=selection.failed_only,
                session_key=selection.session_key,
                task_key=selection.task_key,
                since=selection.since,
                until=selection.until,
                ids=selection.ids,
            )
        total = grading.Outcome()
        for start in range(0, len(ids), BATCH):
            batch = list(load_trajectories(engine, ids=ids[start : start + BATCH]))
            # a regrade starts the count of tries afresh
            with engine.begin() as conn:
                grade_queue.reset_attempts(conn, [t.id for t in batch])
            outcome = grading.grade_and_save(
                engine,
                grader,
                batch,
                tasks=tasks,
                policy=policy,
                signal_weights=SignalWeights.parse(config.signal_weights),
            )
            total.rewarded += outcome.rewarded
            total.retrying += outcome.retrying
            total.failed += outcome.failed
            total.pending += outcome.pending
        grader.close()
        return Report(total, trained)
    finally:
        engine.dispose()


def _tasks(engine: Engine, path: str | None) -> TaskTable:
    """The task table in the store, with the --tasks file's tasks over it (not stored)."""
    with engine.connect() as conn:
        tasks = dict(task_table(conn))
    if path is not None:
        tasks.update(TaskTable.from_jsonl(Path(path)))
    return TaskTable(tasks)
