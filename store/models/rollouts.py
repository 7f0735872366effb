"""The rollout runner's records: runs of a harness on a task, held-out evals and curricula."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from store.json_types import JsonObject
from store.models.base import Base


class RolloutRun(Base):
    """One run of a harness command on one task by the rollout runner (learner/rollout).

    Its trajectories are those with this `session_key` (the harness's base URL is
    /s/<session_key>/v1); the runner grades the run and stamps them with the task key and
    `group_key` (same rollout, round, task and policy version), so the learner neither grades
    them itself nor trains on a group before all its runs are done.
    """

    __tablename__ = "rollout_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(32), index=True)
    task_set: Mapped[str] = mapped_column(String(200), index=True)
    task_key: Mapped[str] = mapped_column(String(500), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    sample: Mapped[int] = mapped_column(Integer)
    session_key: Mapped[str] = mapped_column(String(200), unique=True)
    group_key: Mapped[str | None] = mapped_column(String(200), index=True)
    eval: Mapped[bool] = mapped_column(Boolean, default=False)
    # running -> ok | failed | timeout | cancelled
    status: Mapped[str] = mapped_column(String(16), index=True)
    command: Mapped[list[Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stdout: Mapped[str | None] = mapped_column(Text)
    stderr: Mapped[str | None] = mapped_column(Text)
    # the working directory's final state: {relative path: text, or a note for binary/big}
    workdir: Mapped[JsonObject | None] = mapped_column(JSON)
    policy_version: Mapped[str | None] = mapped_column(String(200), index=True)
    trajectory_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    reward: Mapped[float | None] = mapped_column(Float)
    grade_detail: Mapped[JsonObject | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EvalResult(Base):
    """Success of one policy version on one task of a task set, from one eval rollout."""

    __tablename__ = "eval_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(String(32), index=True)
    task_set: Mapped[str] = mapped_column(String(200), index=True)
    policy_version: Mapped[str | None] = mapped_column(String(200), index=True)
    task_key: Mapped[str] = mapped_column(String(500))
    runs: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    mean_reward: Mapped[float] = mapped_column(Float)
    pass_at_1: Mapped[float] = mapped_column(Float)
    # pass@k with k = the group size (the unbiased estimator over `runs` samples)
    k: Mapped[int] = mapped_column(Integer)
    pass_at_k: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Curriculum(Base):
    """Where a curriculum (`onthejob rollout --curriculum`, learner/rollout/curriculum.py)
    stands: its current stage (None once the last stage is passed), so a restart resumes
    there. `stage_rounds` counts the training rounds of the current stage, `last_eval_round`
    the value it had at the stage's last eval."""

    __tablename__ = "curricula"

    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    path: Mapped[str | None] = mapped_column(Text)
    # [{"name", "rule", "replay", "train_tasks", "eval_tasks"}], in order (last loaded)
    stages: Mapped[list[Any]] = mapped_column(JSON)
    stage: Mapped[str | None] = mapped_column(String(80))
    stage_index: Mapped[int | None] = mapped_column(Integer)
    stage_since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stage_rounds: Mapped[int] = mapped_column(Integer, default=0)
    last_eval_round: Mapped[int | None] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CurriculumEval(Base):
    """One eval of a curriculum stage's split (its runs are in rollout_runs and
    eval_results under `rollout_id`): what the stage's promotion rule reads."""

    __tablename__ = "curriculum_evals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    curriculum: Mapped[str] = mapped_column(String(80), index=True)
    stage: Mapped[str] = mapped_column(String(80))
    rollout_id: Mapped[str] = mapped_column(String(32))
    # the version that answered most of its runs
    policy_version: Mapped[str | None] = mapped_column(String(200))
    stage_round: Mapped[int] = mapped_column(Integer)  # the stage's training rounds before it
    runs: Mapped[int] = mapped_column(Integer)  # graded runs
    k: Mapped[int] = mapped_column(Integer)
    # None: no graded run
    pass_at_1: Mapped[float | None] = mapped_column(Float)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    pass_at_k: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CurriculumPromotion(Base):
    """A curriculum moved on: from a stage whose promotion rule held to the next one
    (`to_stage` None: the last stage was passed), with the version serving and the metrics
    that passed the rule."""

    __tablename__ = "curriculum_promotions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    curriculum: Mapped[str] = mapped_column(String(80), index=True)
    from_stage: Mapped[str] = mapped_column(String(80))
    to_stage: Mapped[str | None] = mapped_column(String(80))
    policy_version: Mapped[str | None] = mapped_column(String(200))
    # {"rule", "value", "evals": [{"rollout_id", "policy_version", "pass_at_1", ...}], ...}
    metrics: Mapped[JsonObject] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
