"""Per interaction type and policy version: trajectories, mean reward and success.

A trajectory counts for the version that served its first call (whose reward it is, as in
the reward statistics). Success is a reward at or above `success_at` (default 1.0, the
rollout runner's success threshold, by which pass@1 is counted), over graded trajectories.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, cast

from sqlalchemy import Connection, case, func, select

from store.clock import iso
from store.models import Trajectory
from store.policy_versions import version_ordinals
from store.traffic_stats import first_version
from store.version_order import version_order

SUCCESS_AT = 1.0
MAX_TYPES = 200


class Figures(TypedDict):
    trajectories: int
    graded: int
    mean_reward: float | None  # None: none graded
    successes: int
    success_rate: float | None


class VersionFigures(Figures):
    policy_version: str | None


class TypeFigures(Figures):
    interaction_type: str | None
    last_call_at: str | None
    by_version: list[VersionFigures]


class _Entry(TypedDict):
    interaction_type: str | None
    versions: list[VersionFigures]
    last: datetime | None


def by_type(
    conn: Connection,
    *,
    success_at: float,
    since: datetime | None = None,
    until: datetime | None = None,
    interaction_type: str | None = None,
) -> list[TypeFigures]:
    """Types, most trajectories first (at most MAX_TYPES), each with its versions."""
    version = first_version().label("version")
    graded = Trajectory.reward.is_not(None)
    query = select(
        Trajectory.interaction_type,
        version,
        func.count(),
        func.count(Trajectory.reward),
        func.avg(Trajectory.reward),
        func.sum(case((graded & (Trajectory.reward >= success_at), 1), else_=0)),
        func.max(Trajectory.last_call_at),
    ).group_by(Trajectory.interaction_type, version)
    if since is not None:
        query = query.where(Trajectory.started_at >= since)
    if until is not None:
        query = query.where(Trajectory.started_at < until)
    if interaction_type is not None:
        query = query.where(Trajectory.interaction_type == interaction_type)
    types: dict[str | None, _Entry] = {}
    for kind, version_name, n, n_graded, mean, successes, last in conn.execute(query):
        entry = types.setdefault(kind, {"interaction_type": kind, "versions": [], "last": None})
        entry["versions"].append(
            cast(
                VersionFigures, _figures(n, n_graded, mean, successes, policy_version=version_name)
            )
        )
        if last is not None and (entry["last"] is None or last > entry["last"]):
            entry["last"] = last
    out: list[TypeFigures] = []
    order = version_order(version_ordinals(conn))
    for entry in types.values():
        versions = sorted(entry["versions"], key=lambda v: order(v["policy_version"]))
        n = sum(v["trajectories"] for v in versions)
        n_graded = sum(v["graded"] for v in versions)
        reward_sum = sum((v["mean_reward"] or 0.0) * v["graded"] for v in versions)
        successes = sum(v["successes"] for v in versions)
        out.append(
            cast(
                TypeFigures,
                {
                    "interaction_type": entry["interaction_type"],
                    **_figures(n, n_graded, reward_sum / n_graded if n_graded else None, successes),
                    "last_call_at": iso(entry["last"]),
                    "by_version": versions,
                },
            )
        )
    out.sort(
        key=lambda t: (
            -t["trajectories"],
            t["interaction_type"] is None,
            t["interaction_type"] or "",
        )
    )
    return out[:MAX_TYPES]


def _figures(
    n: int, n_graded: int, mean: float | None, successes: int | None, **extra: Any
) -> Figures:
    """The figures, after `extra` (a version's name)."""
    successes = int(successes or 0)
    return cast(
        Figures,
        {
            **extra,
            "trajectories": int(n),
            "graded": int(n_graded),
            "mean_reward": None if mean is None or not n_graded else float(mean),
            "successes": successes,
            "success_rate": successes / n_graded if n_graded else None,
        },
    )
