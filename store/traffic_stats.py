"""Traffic and reward statistics, aggregated in the database (PostgreSQL and SQLite alike).

Time buckets are computed in SQL per dialect (date_trunc in UTC / strftime on the stored
UTC text); percentiles are read with ORDER BY ... OFFSET, which both dialects run the same.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from sqlalchemy import ColumnElement, Connection, case, func, select

from store.clock import iso
from store.models import Call, Trajectory
from store.policy_versions import version_ordinals
from store.version_order import version_order

PERCENTILES = (0.5, 0.9, 0.99)
TOP_TASKS = 50


class TrafficBucket(TypedDict):
    t: str | None  # the bucket's start
    calls: int
    errors: int
    tokens_in: int
    tokens_out: int
    mean_latency_ms: float | None


class Traffic(TypedDict):
    calls: int
    calls_per_minute: float
    errors: int
    error_rate: float
    tokens_in: int
    tokens_out: int
    latency_ms: dict[str, float | None]  # p50, p90, p99 (PERCENTILES); None: no call
    mean_ttft_ms: float | None
    series: list[TrafficBucket]


class RewardSums(TypedDict):
    trajectories: int
    mean_reward: float


class VersionReward(RewardSums):
    version: str | None


class TaskReward(RewardSums):
    task_key: str | None


class RewardBucket(RewardSums):
    t: str | None


class Rewards(TypedDict):
    by_version: list[VersionReward]
    by_task: list[TaskReward]
    series: list[RewardBucket]


def _bucket(conn: Connection, column: Any, bucket: str) -> ColumnElement[Any]:
    if conn.dialect.name == "postgresql":
        return func.date_trunc(bucket, func.timezone("UTC", column))
    pattern = "%Y-%m-%d %H:00:00" if bucket == "hour" else "%Y-%m-%d 00:00:00"
    return func.strftime(pattern, column)


def _bucket_label(value: Any) -> str | None:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, str):  # SQLite: "YYYY-MM-DD HH:00:00", UTC
        return value.replace(" ", "T") + "Z"
    return None


def traffic(conn: Connection, *, since: datetime, until: datetime, bucket: str) -> Traffic:
    in_window = (Call.started_at >= since, Call.started_at < until)
    errors = func.sum(case((Call.status != "ok", 1), else_=0))
    total = conn.execute(
        select(
            func.count(),
            errors,
            func.sum(Call.prompt_tokens),
            func.sum(Call.completion_tokens),
            func.avg(Call.ttft_ms),
        ).where(*in_window)
    ).one()
    calls = int(total[0])
    minutes = (until - since).total_seconds() / 60
    label = _bucket(conn, Call.started_at, bucket).label("bucket")
    series = conn.execute(
        select(
            label,
            func.count(),
            errors,
            func.sum(Call.prompt_tokens),
            func.sum(Call.completion_tokens),
            func.avg(Call.latency_ms),
        )
        .where(*in_window)
        .group_by(label)
        .order_by(label)
    )
    return {
        "calls": calls,
        "calls_per_minute": calls / minutes,
        "errors": int(total[1] or 0),
        "error_rate": (int(total[1] or 0) / calls) if calls else 0.0,
        "tokens_in": int(total[2] or 0),
        "tokens_out": int(total[3] or 0),
        "latency_ms": _percentiles(conn, Call.latency_ms, in_window),
        "mean_ttft_ms": None if total[4] is None else float(total[4]),
        "series": [
            {
                "t": _bucket_label(row[0]),
                "calls": int(row[1]),
                "errors": int(row[2] or 0),
                "tokens_in": int(row[3] or 0),
                "tokens_out": int(row[4] or 0),
                "mean_latency_ms": None if row[5] is None else float(row[5]),
            }
            for row in series
        ],
    }


def _percentiles(conn: Connection, column: Any, where: tuple[Any, ...]) -> dict[str, float | None]:
    present = (*where, column.is_not(None))
    n = int(conn.execute(select(func.count()).where(*present)).scalar_one())
    out: dict[str, float | None] = {}
    for p in PERCENTILES:
        key = f"p{round(p * 100)}"
        if n == 0:
            out[key] = None
            continue
        offset = round(p * (n - 1))
        value = conn.execute(
            select(column).where(*present).order_by(column).offset(offset).limit(1)
        ).scalar()
        out[key] = None if value is None else float(value)
    return out


def first_version() -> Any:
    """The version that served a trajectory's first call: whose reward it is."""
    return (
        select(Call.policy_version)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at, Call.id)
        .limit(1)
        .scalar_subquery()
    )


def reward_by_version(conn: Connection) -> dict[str | None, RewardSums]:
    version = first_version().label("version")
    rows = conn.execute(
        select(version, func.count(), func.avg(Trajectory.reward))
        .where(Trajectory.reward.is_not(None))
        .group_by(version)
    )
    return {row[0]: {"trajectories": int(row[1]), "mean_reward": float(row[2])} for row in rows}


def rewards(conn: Connection, *, since: datetime, until: datetime, bucket: str) -> Rewards:
    by_task = conn.execute(
        select(Trajectory.task_key, func.count(), func.avg(Trajectory.reward))
        .where(Trajectory.reward.is_not(None))
        .group_by(Trajectory.task_key)
        .order_by(func.count().desc(), Trajectory.task_key)
        .limit(TOP_TASKS)
    )
    label = _bucket(conn, Trajectory.last_call_at, bucket).label("bucket")
    series = conn.execute(
        select(label, func.count(), func.avg(Trajectory.reward))
        .where(
            Trajectory.reward.is_not(None),
            Trajectory.last_call_at >= since,
            Trajectory.last_call_at < until,
        )
        .group_by(label)
        .order_by(label)
    )
    by_version = reward_by_version(conn)
    order = version_order(version_ordinals(conn))
    return {
        "by_version": [
            {"version": version, **by_version[version]} for version in sorted(by_version, key=order)
        ],
        "by_task": [
            {"task_key": row[0], "trajectories": int(row[1]), "mean_reward": float(row[2])}
            for row in by_task
        ],
        "series": [
            {"t": _bucket_label(row[0]), "trajectories": int(row[1]), "mean_reward": float(row[2])}
            for row in series
        ],
    }
