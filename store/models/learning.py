"""What the learner reads and writes beside the recordings: tasks with reference answers,
grades, feedback, its optimizer steps and its key/value state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.json_types import JsonObject
from store.models.base import Base


class Task(Base):
    """A known task: what makes trajectories comparable, and what a good outcome is."""

    __tablename__ = "tasks"

    key: Mapped[str] = mapped_column(String(500), primary_key=True)
    prompt: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    match: Mapped[str] = mapped_column(String(16), default="exact")
    tolerance: Mapped[float] = mapped_column(Float, default=1e-6)
    task_metadata: Mapped[JsonObject | None] = mapped_column("metadata", JSON)
    # rollout runner (learner/rollout): a learner grader SPEC for this task, a shell command
    # preparing a fresh working directory, and one run there afterwards printing the reward
    grader: Mapped[str | None] = mapped_column(String(500))
    setup: Mapped[str | None] = mapped_column(Text)
    check: Mapped[str | None] = mapped_column(Text)


class Grade(Base):
    """The reward a finished trajectory got, with what the graders said.

    A grading that failed is a row with `error` and no reward: `transient` ones (a judge
    that timed out, a store that was away) are graded again at `retry_at`, with back-off;
    the others stay failed until an operator regrades them (`onthejob regrade`). A row with
    neither reward nor error is a trajectory the learner did not grade because it was too
    stale to train on (`detail` says so).
    """

    __tablename__ = "grades"

    trajectory_id: Mapped[str] = mapped_column(ForeignKey("trajectories.id"), primary_key=True)
    reward: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[JsonObject | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    graded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # the learner step that trained on it (None: not yet used)
    trained_in_step: Mapped[int | None] = mapped_column(Integer, index=True)
    transient: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class Feedback(Base):
    """A reward posted by the harness owner or an end user."""

    __tablename__ = "feedback"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trajectory_id: Mapped[str | None] = mapped_column(String(32), index=True)
    session_key: Mapped[str | None] = mapped_column(String(200), index=True)
    reward: Mapped[float] = mapped_column(Float)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class TurnSignal(Base):
    """A next-turn signal on one assistant turn (store/next_turn.py), as the learner graded
    it: its value, the weight its client key's signals have (`learn --signal-weight`), the
    rule or judge that gave it and what it quoted."""

    __tablename__ = "turn_signals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trajectory_id: Mapped[str] = mapped_column(String(32), index=True)
    call_id: Mapped[str] = mapped_column(String(32))
    turn: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    weight: Mapped[float] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(32))
    source: Mapped[str] = mapped_column(String(16))  # rule | judge
    evidence: Mapped[str] = mapped_column(Text)
    key_name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class TrainingStep(Base):
    """One optimizer step of the learner and what it measured."""

    __tablename__ = "training_steps"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    metrics: Mapped[JsonObject] = mapped_column(JSON)
    # the tenant whose adapter it trained (learn --tenants); null: the shared policy
    tenant: Mapped[str | None] = mapped_column(String(100))


class LearnerState(Base):
    """Small key/value state the learner resumes from (running baselines, knobs)."""

    __tablename__ = "learner_state"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
