"""The grading queue and the grades: which finished trajectories wait for a grade, their
grades, and which grades a step may train on. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, cast

from sqlalchemy import Connection, exists, func, or_, select, true, update
from sqlalchemy.orm import aliased

from store.clock import now
from store.db import insert_for
from store.json_types import JsonObject
from store.models import (
    Call,
    Grade,
    PolicyVersion,
    RolloutRun,
    Trajectory,
)


def _not_a_rollout_run() -> Any:
    """Rollout runs are graded by the runner (learner/rollout), never by the learner."""
    return ~exists().where(RolloutRun.session_key == Trajectory.session_key)


def _gradable() -> Any:
    """Finished, no grade yet or a transient failure now due, and not a rollout run's."""
    due = Grade.transient.is_(True) & (Grade.retry_at <= now()) & Grade.trained_in_step.is_(None)
    return (Trajectory.status == "finished") & (Grade.trajectory_id.is_(None) | due)


def only_keys(keys: Sequence[str]) -> Any:
    """Trajectories every call of which came with one of the client keys named `keys`
    (`onthejob learn --keys`): the traffic the learner is limited to. Looked up per
    trajectory through the calls' (trajectory_id, started_at) index."""
    other = or_(Call.key_name.is_(None), Call.key_name.not_in(list(keys)))
    return ~exists().where(Call.trajectory_id == Trajectory.id, other)


def only_tenant(tenant: str) -> Any:
    """Trajectories every call of which was the tenant's (store/tenants.py): the traffic its
    adapter trains on (`onthejob learn --tenants`)."""
    other = or_(Call.tenant.is_(None), Call.tenant != tenant)
    return ~exists().where(Call.trajectory_id == Trajectory.id, other)


def ungraded_finished(
    conn: Connection, *, limit: int, skip: Sequence[str] = (), keys: Sequence[str] = ()
) -> list[str]:
    """Ids of finished trajectories to grade (never graded, or a retry is due), newest first
    (a learner behind grades what its next step can still use; what grows too stale meanwhile
    is skipped, see `stale_ungraded`), except `skip`; with `keys`, only the traffic of those
    client keys."""
    query = (
        select(Trajectory.id)
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(_gradable())
        .where(_not_a_rollout_run())
        .order_by(Trajectory.last_call_at.desc(), Trajectory.id)
        .limit(limit)
    )
    if skip:
        query = query.where(Trajectory.id.not_in(list(skip)))
    if keys:
        query = query.where(only_keys(keys))
    return [r[0] for r in conn.execute(query)]


def _first_call_ordinal() -> Any:
    """The ordinal of the version that served a trajectory's first call (what its staleness
    is counted from, as in `trainable_grades`); None when no verified version did."""
    return (
        select(PolicyVersion.ordinal)
        .select_from(Call)
        .outerjoin(PolicyVersion, PolicyVersion.version == Call.policy_version)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at)
        .limit(1)
        .scalar_subquery()
    )


def stale_ungraded(
    conn: Connection, *, below_ordinal: int, limit: int, keys: Sequence[str] = ()
) -> list[str]:
    """Ids of trajectories to grade (as `ungraded_finished`) that a version of an ordinal
    below `below_ordinal` served: too stale for any step now (ordinals only grow), whatever
    their grade."""
    query = (
        select(Trajectory.id)
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(_gradable())
        .where(_not_a_rollout_run())
        .where(_first_call_ordinal() < below_ordinal)
        .limit(limit)
    )
    if keys:
        query = query.where(only_keys(keys))
    return [r[0] for r in conn.execute(query)]


def skip_stale(conn: Connection, *, trajectory_ids: Sequence[str], detail: JsonObject) -> None:
    """Record these trajectories as not graded because stale: a grade row with neither reward
    nor error (`stale_skipped` finds them for the next step to count)."""
    for trajectory_id in trajectory_ids:
        save_grade(conn, trajectory_id=trajectory_id, reward=None, detail=detail, error=None)


def stale_skipped(conn: Connection, *, keys: Sequence[str] = ()) -> list[str]:
    """Ids of trajectories `skip_stale` recorded that no step has counted yet."""
    query = select(Grade.trajectory_id).where(
        Grade.trained_in_step.is_(None), Grade.reward.is_(None), Grade.error.is_(None)
    )
    if keys:
        query = query.join(Trajectory, Trajectory.id == Grade.trajectory_id).where(only_keys(keys))
    return [r[0] for r in conn.execute(query.order_by(Grade.trajectory_id))]


def count_ungraded_finished(conn: Connection, *, keys: Sequence[str] = ()) -> int:
    query = (
        select(func.count())
        .select_from(Trajectory)
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(_gradable())
        .where(_not_a_rollout_run())
    )
    if keys:
        query = query.where(only_keys(keys))
    return int(conn.execute(query).scalar_one())


def count_graded_untrained(conn: Connection) -> int:
    """Graded with a reward, not trained on yet."""
    return int(
        conn.execute(
            select(func.count())
            .select_from(Grade)
            .where(Grade.trained_in_step.is_(None), Grade.reward.is_not(None))
        ).scalar_one()
    )


def count_open(conn: Connection) -> int:
    """Trajectories still open (a call may yet join them)."""
    return int(
        conn.execute(
            select(func.count()).select_from(Trajectory).where(Trajectory.status == "open")
        ).scalar_one()
    )


def grade_details_with(
    conn: Connection, key: str, *, since: datetime | None, limit: int
) -> list[tuple[str, JsonObject | None]]:
    """(trajectory id, grade detail) of the newest `limit` grades, graded at or after `since`,
    whose detail holds `key`."""
    query = (
        select(Grade.trajectory_id, Grade.detail)
        .where(Grade.detail[key].as_string().is_not(None))
        .order_by(Grade.graded_at.desc())
        .limit(limit)
    )
    if since is not None:
        query = query.where(Grade.graded_at >= since)
    return [(trajectory_id, detail) for trajectory_id, detail in conn.execute(query)]


def grading_failures(conn: Connection) -> dict[str, int]:
    """Gradings that failed and are not trained on: to be tried again, or failed for good."""
    rows = conn.execute(
        select(Grade.transient, func.count())
        .where(Grade.error.is_not(None), Grade.trained_in_step.is_(None))
        .group_by(Grade.transient)
    )
    counts = {bool(transient): int(n) for transient, n in rows}
    return {"retrying": counts.get(True, 0), "failed": counts.get(False, 0)}


def grade_attempts(conn: Connection, ids: Sequence[str]) -> dict[str, int]:
    if not ids:
        return {}
    rows = conn.execute(
        select(Grade.trajectory_id, Grade.attempts).where(Grade.trajectory_id.in_(list(ids)))
    )
    return {trajectory_id: int(attempts or 0) for trajectory_id, attempts in rows}


def reset_attempts(conn: Connection, ids: Sequence[str]) -> None:
    if ids:
        conn.execute(
            update(Grade)
            .where(Grade.trajectory_id.in_(list(ids)), Grade.trained_in_step.is_(None))
            .values(attempts=0)
        )


def retry_failed_now(conn: Connection) -> None:
    """Transient failures are due at once (the task table changed: they may grade now)."""
    conn.execute(
        update(Grade)
        .where(Grade.transient.is_(True), Grade.trained_in_step.is_(None))
        .values(retry_at=now())
    )


def regrade_candidates(
    conn: Connection,
    *,
    failed_only: bool,
    session_key: str | None = None,
    task_key: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    ids: Sequence[str] = (),
) -> tuple[list[str], int]:
    """Finished trajectories matching every filter that no step trained on, oldest first
    (rollout runs excluded: their runner grades them), and how many matched but were
    trained on already."""
    query = (
        select(Trajectory.id, Grade.trained_in_step)
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(Trajectory.status == "finished")
        .where(_not_a_rollout_run())
        .order_by(Trajectory.last_call_at, Trajectory.id)
    )
    if failed_only:
        query = query.where(Grade.error.is_not(None))
    if session_key is not None:
        query = query.where(Trajectory.session_key == session_key)
    if task_key is not None:
        query = query.where(Trajectory.task_key == task_key)
    if since is not None:
        query = query.where(Trajectory.last_call_at >= since)
    if until is not None:
        query = query.where(Trajectory.started_at < until)
    if ids:
        query = query.where(Trajectory.id.in_(list(ids)))
    rows = conn.execute(query).all()
    return [r[0] for r in rows if r[1] is None], sum(r[1] is not None for r in rows)


def save_grade(
    conn: Connection,
    *,
    trajectory_id: str,
    reward: float | None,
    detail: JsonObject,
    error: str | None,
    transient: bool = False,
    retry_at: datetime | None = None,
    attempts: int = 1,
) -> None:
    """Insert, or replace a grade no step trained on (a retry, a regrade)."""
    values = {
        "trajectory_id": trajectory_id,
        "reward": reward,
        "detail": detail,
        "error": error,
        "graded_at": now(),
        "transient": transient,
        "retry_at": retry_at,
        "attempts": attempts,
    }
    table = Grade.__table__
    stmt = insert_for(conn, table).values(values)
    changed = {k: v for k, v in values.items() if k != "trajectory_id"}
    stmt = stmt.on_conflict_do_update(
        index_elements=["trajectory_id"],
        set_=changed,
        where=table.c.trained_in_step.is_(None),
    )
    conn.execute(stmt)
    conn.execute(
        update(Trajectory)
        .where(
            Trajectory.id == trajectory_id,
            ~exists().where(
                Grade.trajectory_id == trajectory_id, Grade.trained_in_step.is_not(None)
            ),
        )
        .values(reward=reward)
    )


class TrainableGrade(TypedDict):
    """A graded trajectory not yet trained on (`trainable_grades`)."""

    trajectory_id: str
    task_key: str | None
    group_key: str | None  # the explicit GRPO group; None for organic ones
    interaction_type: str | None
    reward: float
    policy_version: str | None  # its first call's
    started_at: datetime
    last_call_at: datetime
    graded_at: datetime


def trainable_grades(
    conn: Connection, *, keys: Sequence[str] = (), tenant: str | None = None
) -> list[TrainableGrade]:
    """Graded trajectories not yet trained on: id, task_key, group_key, interaction_type,
    reward, policy version, when it started and last called (started_at, last_call_at) and
    was graded (graded_at); with `keys`, only the traffic of those client keys (rollout runs,
    graded by their runner, included); with `tenant`, only that tenant's.

    group_key: the explicit GRPO group (fan-out siblings share one), None for organic ones.
    """
    first_version = (
        select(Call.policy_version)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at)
        .limit(1)
        .scalar_subquery()
    )
    rows = conn.execute(
        select(
            Grade.trajectory_id,
            Trajectory.task_key,
            Trajectory.group_key,
            Trajectory.interaction_type,
            Grade.reward,
            first_version.label("policy_version"),
            Trajectory.started_at,
            Trajectory.last_call_at,
            Grade.graded_at,
        )
        .join(Trajectory, Trajectory.id == Grade.trajectory_id)
        .where(Grade.trained_in_step.is_(None), Grade.reward.is_not(None))
        .where(only_keys(keys) if keys else true())
        .where(only_tenant(tenant) if tenant is not None else true())
        # a fixed order: the running baselines fold rewards in it, on every run alike
        .order_by(Grade.graded_at, Grade.trajectory_id)
    )
    return [cast(TrainableGrade, dict(r._mapping)) for r in rows]


def grade_details(conn: Connection, ids: Sequence[str]) -> dict[str, JsonObject]:
    """The detail of each of these trajectories' grades (what per-turn credit reads)."""
    rows = conn.execute(
        select(Grade.trajectory_id, Grade.detail).where(Grade.trajectory_id.in_(list(ids)))
    )
    return {r.trajectory_id: dict(r.detail or {}) for r in rows}


def incomplete_groups(conn: Connection) -> set[str]:
    """Explicit groups (fan-out) some of whose trajectories are not graded yet.

    Their members wait: trained early, the siblings would form a group without the answer
    the client got (which finishes later, on idle timeout).
    """
    rows = conn.execute(
        select(Trajectory.group_key)
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(Trajectory.group_key.is_not(None))
        .group_by(Trajectory.group_key)
        .having(func.count(Grade.trajectory_id) < func.count(Trajectory.id))
    )
    return {r[0] for r in rows} | rollout_groups_still_running(conn)


def rollout_groups_still_running(conn: Connection) -> set[str]:
    """Rollout groups one of whose runs (same rollout, round and task) is still running."""
    running = aliased(RolloutRun)
    rows = conn.execute(
        select(RolloutRun.group_key)
        .distinct()
        .where(RolloutRun.group_key.is_not(None))
        .where(
            exists().where(
                running.rollout_id == RolloutRun.rollout_id,
                running.epoch == RolloutRun.epoch,
                running.task_key == RolloutRun.task_key,
                running.status == "running",
            )
        )
    )
    return {r[0] for r in rows}


def mark_trained(conn: Connection, *, trajectory_ids: Sequence[str], step: int) -> None:
    if trajectory_ids:
        conn.execute(
            update(Grade)
            .where(Grade.trajectory_id.in_(list(trajectory_ids)))
            .values(trained_in_step=step)
        )


@dataclass(frozen=True)
class RewardedGrade:
    trajectory_id: str
    reward: float
    detail: JsonObject | None  # what the grader said (JSON, its own shape)
    graded_at: datetime


def rewarded_grades_after(
    conn: Connection, *, after: datetime | None, after_id: str, limit: int
) -> list[RewardedGrade]:
    """Rewarded grades (organic trajectories' and rollout runs') after the cursor
    (graded_at, trajectory_id), oldest first."""
    query = (
        select(Grade.trajectory_id, Grade.reward, Grade.detail, Grade.graded_at)
        .where(Grade.reward.is_not(None), Grade.error.is_(None))
        .order_by(Grade.graded_at, Grade.trajectory_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(
            or_(
                Grade.graded_at > after,
                (Grade.graded_at == after) & (Grade.trajectory_id > after_id),
            )
        )
    return [RewardedGrade(*r) for r in conn.execute(query)]


def add_to_grade_detail(conn: Connection, *, trajectory_id: str, key: str, value: Any) -> bool:
    """Put `key` into a grade's detail (what a step trained on stays as it was: the reward
    and the rest of the detail); whether the grade was there."""
    detail = conn.execute(select(Grade.detail).where(Grade.trajectory_id == trajectory_id)).scalar()
    if detail is None:
        return False
    result = conn.execute(
        update(Grade)
        .where(Grade.trajectory_id == trajectory_id)
        .values(detail={**detail, key: value})
    )
    return bool(result.rowcount)
