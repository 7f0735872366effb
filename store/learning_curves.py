"""Learning curves: mean reward per interaction type over time, with a 95% confidence band.

The buckets fit the run: their size is the smallest "round" duration (10 s ... 30 days) that
cuts the window into at most `buckets` pieces, so a 10-minute demo gets 30-second points and
a month of traffic gets days. A trajectory counts at its last call (when it finished).
Aggregated in SQL on both dialects: the bucket index is the seconds since the window's start
divided by the bucket size.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from sqlalchemy import ColumnElement, Connection, Integer, case, cast, func, select

from store.clock import iso
from store.models import Trajectory

ROUND_SECONDS = (
    *(10, 15, 30),
    *(60 * m for m in (1, 2, 5, 10, 15, 30)),
    *(3600 * h for h in (1, 2, 3, 6, 12)),
    *(86400 * d for d in (1, 2, 7, 14, 30)),
)
MAX_TYPES = 8  # curves drawn in one chart, the types with the most graded trajectories
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


class CurvePoint(TypedDict):
    t: str | None  # the bucket's start
    trajectories: int
    mean_reward: float
    low: float | None  # the 95% band; None from a single trajectory
    high: float | None
    success_rate: float


class Curve(TypedDict):
    interaction_type: str | None
    trajectories: int
    points: list[CurvePoint]


class Curves(TypedDict):
    bucket_seconds: int | None  # None: nothing graded in the window
    since: str | None
    until: str | None
    success_at: float
    types_total: int
    types: list[Curve]


def bucket_seconds(span: timedelta, buckets: int) -> int:
    """The smallest round bucket size that cuts `span` into at most `buckets` pieces."""
    seconds = max(span.total_seconds(), 1.0)
    for size in ROUND_SECONDS:
        if seconds / size <= buckets:
            return size
    return math.ceil(seconds / buckets / 86400) * 86400


def band(n: int, mean: float, mean_of_squares: float) -> tuple[float | None, float | None]:
    """mean ± 1.96 standard errors (sample standard deviation); none from a single sample."""
    if n < 2:
        return None, None
    variance = max(0.0, mean_of_squares - mean * mean) * n / (n - 1)
    half = Z95 * math.sqrt(variance / n)
    return mean - half, mean + half


def _seconds_since(conn: Connection, column: Any, start: datetime) -> ColumnElement[Any]:
    if conn.dialect.name == "postgresql":
        return func.extract("epoch", column - start)
    # SQLite keeps UTC text; julianday reads it, in days. A day as a double is exact to
    # about 10 us, so the seconds are rounded to the millisecond: a trajectory exactly on a
    # bucket's edge falls in the later bucket on both databases
    naive = start.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")
    return func.round((func.julianday(column) - func.julianday(naive)) * 86400.0, 3)


def _window(
    conn: Connection, since: datetime | None, until: datetime | None
) -> tuple[datetime, datetime] | None:
    graded = [Trajectory.reward.is_not(None)]
    if since is not None:
        graded.append(Trajectory.last_call_at >= since)
    if until is not None:
        graded.append(Trajectory.last_call_at < until)
    first, last = conn.execute(
        select(func.min(Trajectory.last_call_at), func.max(Trajectory.last_call_at)).where(*graded)
    ).one()
    if first is None:
        return None
    first, last = _aware(first), _aware(last)
    return since or first, until or last + timedelta(microseconds=1)


def _aware(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite, for an aggregate over the column
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def curves(
    conn: Connection,
    *,
    buckets: int,
    success_at: float,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Curves:
    window = _window(conn, since, until)
    if window is None:
        return {
            "bucket_seconds": None,
            "since": None,
            "until": None,
            "success_at": success_at,
            "types_total": 0,
            "types": [],
        }
    start, end = window
    size = bucket_seconds(end - start, buckets)
    offset = _seconds_since(conn, Trajectory.last_call_at, start)
    index = (
        func.floor(offset / size)
        if conn.dialect.name == "postgresql"
        else cast(offset / size, Integer)  # offset >= 0: truncation is floor
    ).label("bucket")
    reward = Trajectory.reward
    rows = conn.execute(
        select(
            Trajectory.interaction_type,
            index,
            func.count(),
            func.avg(reward),
            func.avg(reward * reward),
            func.sum(case((reward >= success_at, 1), else_=0)),
        )
        .where(
            reward.is_not(None),
            Trajectory.last_call_at >= start,
            Trajectory.last_call_at < end,
        )
        .group_by(Trajectory.interaction_type, index)
        .order_by(Trajectory.interaction_type, index)
    )
    by_type: dict[str | None, list[CurvePoint]] = {}
    for kind, bucket, n, mean, mean_sq, successes in rows:
        low, high = band(int(n), float(mean), float(mean_sq))
        by_type.setdefault(kind, []).append(
            {
                "t": iso(start + timedelta(seconds=int(bucket) * size)),
                "trajectories": int(n),
                "mean_reward": float(mean),
                "low": low,
                "high": high,
                "success_rate": int(successes or 0) / int(n),
            }
        )
    ranked = sorted(
        by_type.items(),
        key=lambda item: (-sum(p["trajectories"] for p in item[1]), item[0] is None, item[0] or ""),
    )
    return {
        "bucket_seconds": size,
        "since": iso(start),
        "until": iso(end),
        "success_at": success_at,
        "types_total": len(ranked),
        "types": [
            {
                "interaction_type": kind,
                "trajectories": sum(p["trajectories"] for p in points),
                "points": points,
            }
            for kind, points in ranked[:MAX_TYPES]
        ],
    }
