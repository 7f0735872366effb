"""How each arm of a canary did, from what the calls recorded (store/canaries.py).

An arm is the calls its version answered: every call records the version that answered it,
so a call of the candidate's share that the candidate could not serve (its adapter not
loaded on the replica) counts for the incumbent, which answered it. The calls counted are
those of the canary's scope (its tenant's, or the calls of no tenant for the shared policy)
from its start until its decision (or now). An unknown incumbent (nothing was known to serve
the scope at the start) is every other version that answered in the window.

Per arm: calls, errors and latency; the graded trajectories and their rewards (a trajectory
belongs to the version that answered its first call, as in tenant_stats); the next-turn
signals on its calls (corrections, retries, tool errors...). The sums of rewards and of their
squares are given with the means, for a sequential test to read.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from sqlalchemy import Connection, case, func, select

from store.models import Call, Grade, Trajectory, TurnSignal

if TYPE_CHECKING:
    from store.canaries import CanaryRow

ARMS = ("candidate", "incumbent")


class SignalCounts(TypedDict):
    negative: int
    positive: int
    negative_by_rule: dict[str, int]


class ArmSums(TypedDict):
    """An arm's sums while they are added up."""

    version: str | None
    calls: int
    errors: int
    timed: int  # calls with a latency
    latency: float
    graded: int
    reward_sum: float
    reward_squares: float
    signals: SignalCounts


class ArmSignals(SignalCounts):
    negative_per_call: float | None


class ArmStats(TypedDict):
    """How one arm of a canary did."""

    version: str | None
    calls: int
    errors: int
    error_rate: float | None
    mean_latency_ms: float | None
    graded: int
    mean_reward: float | None
    reward_sd: float | None
    reward_sum: float
    reward_squares: float
    signals: ArmSignals


class CanaryArms(TypedDict):
    candidate: ArmStats
    incumbent: ArmStats


def arm_stats(conn: Connection, canary: CanaryRow, *, now: datetime) -> CanaryArms:
    """{"candidate": {...}, "incumbent": {...}} for a canary as `canaries.get_canary` gives it."""
    window = (canary["started_at"], canary["decided_at"] or now)
    arms = {arm: _empty(canary[arm]) for arm in ARMS}
    for version, stats in _calls(conn, canary, window).items():
        _add(arms[_arm(canary, version)], stats)
    for version, stats in _rewards(conn, canary, window).items():
        _add(arms[_arm(canary, version)], stats)
    for version, by_rule in _signals(conn, canary, window).items():
        signals = arms[_arm(canary, version)]["signals"]
        for rule, (negative, positive) in by_rule.items():
            signals["negative"] += negative
            signals["positive"] += positive
            if negative:
                signals["negative_by_rule"][rule] = (
                    signals["negative_by_rule"].get(rule, 0) + negative
                )
    return cast(CanaryArms, {arm: _finish(stats) for arm, stats in arms.items()})


def _arm(canary: CanaryRow, version: str | None) -> str:
    return "candidate" if version == canary["candidate"] else "incumbent"


def _in_arms(column: Any, canary: CanaryRow) -> Any:
    if canary["incumbent"] is None:
        return column.is_not(None)
    return column.in_([canary["candidate"], canary["incumbent"]])


def _in_scope(column: Any, canary: CanaryRow) -> Any:
    tenant = canary["tenant"]
    return column.is_(None) if tenant is None else column == tenant


def _calls(
    conn: Connection, canary: CanaryRow, window: tuple[datetime, datetime]
) -> dict[str | None, dict[str, float]]:
    failed = func.sum(case((Call.status == "ok", 0), else_=1))
    rows = conn.execute(
        select(
            Call.policy_version,
            func.count(),
            failed,
            func.count(Call.latency_ms),
            func.sum(Call.latency_ms),
        )
        .where(
            _in_scope(Call.tenant, canary),
            _in_arms(Call.policy_version, canary),
            Call.started_at >= window[0],
            Call.started_at <= window[1],
        )
        .group_by(Call.policy_version)
    )
    return {
        version: {"calls": n, "errors": int(errors or 0), "timed": timed, "latency": lat or 0.0}
        for version, n, errors, timed, lat in rows
    }


def _rewards(
    conn: Connection, canary: CanaryRow, window: tuple[datetime, datetime]
) -> dict[str | None, dict[str, float]]:
    first = (
        select(Call.tenant, Call.policy_version)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at, Call.id)
        .limit(1)
        .correlate(Trajectory)
    )
    tenant = first.with_only_columns(Call.tenant).scalar_subquery()
    version = first.with_only_columns(Call.policy_version).scalar_subquery()
    rows = conn.execute(
        select(version, func.count(), func.sum(Grade.reward), func.sum(Grade.reward * Grade.reward))
        .select_from(Grade)
        .join(Trajectory, Trajectory.id == Grade.trajectory_id)
        .where(
            Grade.reward.is_not(None),
            Trajectory.started_at >= window[0],
            Trajectory.started_at <= window[1],
            _in_scope(tenant, canary),
            _in_arms(version, canary),
        )
        .group_by(version)
    )
    return {
        v: {"graded": n, "reward_sum": float(total), "reward_squares": float(squares)}
        for v, n, total, squares in rows
    }


def _signals(
    conn: Connection, canary: CanaryRow, window: tuple[datetime, datetime]
) -> dict[str | None, dict[str, tuple[int, int]]]:
    rows = conn.execute(
        select(
            Call.policy_version,
            TurnSignal.rule,
            func.sum(case((TurnSignal.value < 0, 1), else_=0)),
            func.sum(case((TurnSignal.value > 0, 1), else_=0)),
        )
        .join(Call, Call.id == TurnSignal.call_id)
        .where(
            _in_scope(Call.tenant, canary),
            _in_arms(Call.policy_version, canary),
            Call.started_at >= window[0],
            Call.started_at <= window[1],
        )
        .group_by(Call.policy_version, TurnSignal.rule)
    )
    found: dict[str | None, dict[str, tuple[int, int]]] = {}
    for version, rule, negative, positive in rows:
        found.setdefault(version, {})[rule] = (int(negative or 0), int(positive or 0))
    return found


def _empty(version: str | None) -> ArmSums:
    return {
        "version": version,
        "calls": 0,
        "errors": 0,
        "timed": 0,
        "latency": 0.0,
        "graded": 0,
        "reward_sum": 0.0,
        "reward_squares": 0.0,
        "signals": {"negative": 0, "positive": 0, "negative_by_rule": {}},
    }


def _add(into: ArmSums, stats: dict[str, float]) -> None:
    for key, value in stats.items():
        into[key] += value


def _finish(arm: ArmSums) -> ArmStats:
    """Means and rates from the sums; None where there is nothing to average."""
    calls, graded = arm["calls"], arm["graded"]
    mean = arm["reward_sum"] / graded if graded else None
    variance = arm["reward_squares"] / graded - mean * mean if mean is not None else None
    return {
        "version": arm["version"],
        "calls": calls,
        "errors": arm["errors"],
        "error_rate": arm["errors"] / calls if calls else None,
        "mean_latency_ms": arm["latency"] / arm["timed"] if arm["timed"] else None,
        "graded": graded,
        "mean_reward": mean,
        "reward_sd": math.sqrt(max(variance, 0.0)) if variance is not None else None,
        "reward_sum": arm["reward_sum"],
        "reward_squares": arm["reward_squares"],
        "signals": {
            **arm["signals"],
            "negative_per_call": arm["signals"]["negative"] / calls if calls else None,
        },
    }
