"""Statistics: traffic (calls/min, tokens, latency percentiles, errors) and rewards."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from proxy.admin import stats
from proxy.admin.deps import EngineDep
from proxy.admin.schemas import StatsQuery
from proxy.admin.trajectories import iso

router = APIRouter(tags=["stats"])


@router.get("/stats", summary="Traffic and reward statistics in a time window")
def get_stats(engine: EngineDep, query: Annotated[StatsQuery, Query()]) -> dict[str, Any]:
    """Traffic within [since, until) in hour or day buckets (UTC); rewards by policy
    version and by task over all time, and over the window by when trajectories ended."""
    since, until = stats.window(query.since, query.until, query.bucket)
    with engine.connect() as conn:
        return {
            "since": iso(since),
            "until": iso(until),
            "bucket": query.bucket,
            "traffic": stats.traffic(conn, since=since, until=until, bucket=query.bucket),
            "rewards": stats.rewards(conn, since=since, until=until, bucket=query.bucket),
        }
