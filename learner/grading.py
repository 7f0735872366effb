"""Grading finished trajectories and keeping what came of it: the learner's grading phase
and `onthejob regrade`.

Invariant: a trajectory has at most one grade row, and a row a step trained on never
changes. A transient failure's row is due again at `retry_at`, the wait doubling from
`RetryPolicy.base` up to `cap`; after `max_attempts` tries it counts as permanent, and a
permanent one stays until an operator regrades it. Trajectories waiting for feedback get no
row at all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Engine

from learner.config import LearnerConfig
from learner.graders.base import Grade, Grader
from learner.graders.rubrics import Rubrics
from learner.graders.selfjudge import DefaultGrader, ShadowPolicy, build_default_grader
from learner.signals import SignalWeights, signals_in, weighed_signals
from store import grade_queue, turn_signals
from store.feedback import latest_feedback
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

log = logging.getLogger("onthejob.learner")


@dataclass(frozen=True)
class RetryPolicy:
    base: float = 30.0  # seconds before the first retry
    cap: float = 3600.0  # the longest wait between two tries
    max_attempts: int = 8  # tries in all; after the last a transient failure is permanent

    def retry_at(self, attempts: int, now: datetime) -> datetime:
        wait = min(self.base * 2.0 ** (attempts - 1), self.cap)
        return now + timedelta(seconds=wait)


@dataclass
class Outcome:
    rewarded: int = 0
    retrying: int = 0  # transient failures, graded again later
    failed: int = 0  # permanent failures
    pending: list[str] = field(default_factory=list)  # waiting for feedback: no row

    @property
    def saved(self) -> int:
        return self.rewarded + self.retrying + self.failed


class DatabaseFeedback:
    """Feedback posted through the proxy's feedback endpoint, read from the store."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def reward_for(
        self, trajectory_id: str, session: str | None
    ) -> tuple[float, str | None] | None:
        with self.engine.connect() as conn:
            return latest_feedback(conn, trajectory_id=trajectory_id, session_key=session)


def learner_grader(
    config: LearnerConfig, engine: Engine, *, shadow_inline: bool = True
) -> DefaultGrader:
    """The graders `onthejob learn` and `onthejob regrade` use, from their settings: the
    configured ones, and the served model judging itself where none of them applies.
    `shadow_inline=False`: the self-judge's shadow verdicts are left to a pass over the
    stored grades (learner/shadow_judging.py), so grading never waits on them."""
    return build_default_grader(
        config.graders,
        judge_base_url=config.judge_base_url or config.upstreams[0] + "/v1",
        judge_model=config.judge_model,
        self_judge=config.self_judge,
        rubrics=Rubrics.load(config.rubrics) if config.rubrics else Rubrics(),
        shadow=ShadowPolicy(
            share=config.self_judge_shadow, per_minute=config.self_judge_per_minute
        ),
        feedback_source=DatabaseFeedback(engine),
        feedback_wait_seconds=config.feedback_wait,
        command_timeout=config.command_timeout,
        judge_max_tokens=config.judge_max_tokens,
        judge_reasoning_chars=config.judge_reasoning_chars,
        judge_temperature=config.judge_temperature,
        judge_seed=config.judge_seed,
        signal_weights=SignalWeights.parse(config.signal_weights),
        shadow_inline=shadow_inline,
    )


def grade_and_save(
    engine: Engine,
    grader: Grader,
    trajectories: Sequence[Trajectory],
    *,
    tasks: TaskTable,
    policy: RetryPolicy,
    signal_weights: SignalWeights | None = None,
) -> Outcome:
    """Grade `trajectories` and store each result (see the module), and with
    `signal_weights`, each one's next-turn signals (store/turn_signals.py)."""
    grades = grader.grade(list(trajectories), tasks=tasks)
    ids = [t.id for t in trajectories]
    by_id = {t.id: t for t in trajectories}
    outcome = Outcome()
    now = datetime.now(UTC)
    with engine.begin() as conn:
        tries = grade_queue.grade_attempts(conn, ids)
        for trajectory_id, grade in zip(ids, grades, strict=True):
            if grade.pending:
                outcome.pending.append(trajectory_id)
                continue
            _save(conn, trajectory_id, grade, tries.get(trajectory_id, 0) + 1, policy, now)
            if signal_weights is not None:
                # as the next_turn grader found them (its judge's included), else by the rules
                found = signals_in(grade.detail)
                if found is None:
                    found = weighed_signals(by_id[trajectory_id], signal_weights)
                turn_signals.save_signals(conn, trajectory_id=trajectory_id, signals=found, now=now)
            if grade.error is None:
                outcome.rewarded += 1
            elif grade.transient and tries.get(trajectory_id, 0) + 1 < policy.max_attempts:
                outcome.retrying += 1
            else:
                outcome.failed += 1
    return outcome


def _save(
    conn: Connection,
    trajectory_id: str,
    grade: Grade,
    attempts: int,
    policy: RetryPolicy,
    now: datetime,
) -> None:
    error, transient = grade.error, grade.error is not None and grade.transient
    if transient and attempts >= policy.max_attempts:
        error, transient = f"gave up after {attempts} tries: {error}", False
    if error is not None:
        kind = "will be tried again" if transient else "failed"
        log.warning("grading of trajectory %s %s: %s", trajectory_id, kind, error)
    grade_queue.save_grade(
        conn,
        trajectory_id=trajectory_id,
        reward=grade.reward if error is None else None,
        detail=grade.detail,
        error=error,
        transient=transient,
        retry_at=policy.retry_at(attempts, now) if transient else None,
        attempts=attempts,
    )
