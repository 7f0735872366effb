"""The runner's reads and writes: rollout runs, stamping their trajectories, eval results.

How a run's trajectories are found: the harness's base URL carries the run's session key
(`/s/rollout-<run id>/v1`), so the proxy records every call of the run under it. When the
run has ended and its calls are in, the runner stamps those trajectories with the task key
and the run's GRPO `group_key`, finishes them and writes their Grade (eval runs: marked as
used, `trained_in_step = -1`, so nothing trains on them). Callers own the transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, cast

from sqlalchemy import Connection, func, insert, select, update

from store import grade_queue, turn_signals
from store.json_types import JsonObject
from store.models import Call, EvalResult, RolloutRun, Trajectory
from store.turn_signals import Stored


class RunRow(TypedDict):
    """A rollout run's row (store.models.RolloutRun)."""

    id: str
    rollout_id: str
    task_set: str
    task_key: str
    epoch: int
    sample: int
    session_key: str
    group_key: str | None
    eval: bool
    status: str  # running | ok | failed | timeout | cancelled
    command: list[str] | None
    exit_code: int | None
    stdout: str | None
    stderr: str | None
    workdir: JsonObject | None  # {relative path: text, or a note}
    policy_version: str | None
    trajectory_ids: list[str] | None
    reward: float | None
    grade_detail: JsonObject | None
    error: str | None
    started_at: datetime
    ended_at: datetime | None


class EvalResultRow(TypedDict):
    """Success of one version on one task of a task set (`id`, `created_at`: once stored)."""

    id: NotRequired[int]
    rollout_id: str
    task_set: str
    policy_version: str | None
    task_key: str
    runs: int
    successes: int
    mean_reward: float
    pass_at_1: float
    k: int
    pass_at_k: float
    created_at: NotRequired[datetime]


def now() -> datetime:
    return datetime.now(UTC)


def session_key_for(run_id: str) -> str:
    return f"rollout-{run_id}"


def group_key_for(rollout_id: str, epoch: int, task_key: str, policy_version: str | None) -> str:
    """One GRPO group: the runs of one rollout, round and task under one policy version."""
    digest = hashlib.sha256(f"{task_key}\0{policy_version or ''}".encode()).hexdigest()[:20]
    return f"rollout:{rollout_id}:{epoch}:{digest}"


def start_run(conn: Connection, **values: Any) -> None:
    conn.execute(insert(RolloutRun).values(status="running", started_at=now(), **values))


def call_count(conn: Connection, *, session_key: str) -> int:
    query = select(func.count()).select_from(Call).where(Call.session_key == session_key)
    return int(conn.execute(query).scalar_one())


def trajectory_ids(conn: Connection, *, session_key: str) -> list[str]:
    rows = conn.execute(
        select(Trajectory.id)
        .where(Trajectory.session_key == session_key)
        .order_by(Trajectory.started_at)
    )
    return [r[0] for r in rows]


def first_policy_version(conn: Connection, *, session_key: str) -> str | None:
    return conn.execute(
        select(Call.policy_version)
        .where(Call.session_key == session_key, Call.policy_version.is_not(None))
        .order_by(Call.started_at)
        .limit(1)
    ).scalar()


def stamp_trajectories(
    conn: Connection, *, ids: list[str], task_key: str, group_key: str | None
) -> None:
    """The run's trajectories get its task and group, and are finished (the run is over)."""
    if not ids:
        return
    conn.execute(
        update(Trajectory)
        .where(Trajectory.id.in_(ids))
        .values(
            task_key=task_key,
            group_key=group_key,
            status="finished",
            ended_at=func.coalesce(Trajectory.ended_at, now()),
        )
    )


def save_grades(
    conn: Connection,
    *,
    ids: list[str],
    reward: float | None,
    detail: JsonObject,
    error: str | None,
    trainable: bool,
    signals: Sequence[Stored] | None = None,
) -> None:
    """The run's grade on each of its trajectories, and the next-turn signals it found
    (a next_turn grader's), each on the trajectory of the call it judged."""
    for trajectory_id in ids:
        grade_queue.save_grade(
            conn, trajectory_id=trajectory_id, reward=reward, detail=detail, error=error
        )
    if signals is not None:
        turn_signals.save_run_signals(
            conn, trajectory_ids=ids, signals=signals, now=datetime.now(UTC)
        )
    if not trainable:  # eval runs: graded, already "used", never a training signal
        grade_queue.mark_trained(conn, trajectory_ids=ids, step=-1)


def finish_run(conn: Connection, *, run_id: str, **values: Any) -> None:
    conn.execute(update(RolloutRun).where(RolloutRun.id == run_id).values(ended_at=now(), **values))


def update_run(conn: Connection, *, run_id: str, **values: Any) -> None:
    conn.execute(update(RolloutRun).where(RolloutRun.id == run_id).values(**values))


def cancel_unfinished(conn: Connection, *, rollout_id: str) -> int:
    """Runs left `running` (their worker never got to finish them): cancelled."""
    result = conn.execute(
        update(RolloutRun)
        .where(RolloutRun.rollout_id == rollout_id, RolloutRun.status == "running")
        .values(status="cancelled", ended_at=now(), error="cancelled")
    )
    return int(result.rowcount or 0)


def runs_of(conn: Connection, *, rollout_id: str) -> list[RunRow]:
    rows = conn.execute(
        select(RolloutRun.__table__)
        .where(RolloutRun.rollout_id == rollout_id)
        .order_by(RolloutRun.started_at)
    )
    return [cast(RunRow, dict(r._mapping)) for r in rows]


def add_eval_results(conn: Connection, rows: list[EvalResultRow]) -> None:
    if rows:
        conn.execute(insert(EvalResult), [{**row, "created_at": now()} for row in rows])


def eval_results(conn: Connection) -> list[EvalResultRow]:
    rows = conn.execute(select(EvalResult.__table__).order_by(EvalResult.id))
    return [cast(EvalResultRow, dict(r._mapping)) for r in rows]
