"""Statistics: traffic (calls/min, tokens, latency percentiles, errors), rewards and the
learning curves per interaction type."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Query

from proxy.admin.deps import EngineDep
from proxy.admin.schemas import CurvesQuery, StatsQuery
from proxy.admin.stats import window
from store import learning_curves, traffic_stats
from store.clock import iso
from store.learning_curves import Curves
from store.traffic_stats import Rewards, Traffic

router = APIRouter(tags=["stats"])


class Stats(TypedDict):
    since: str | None
    until: str | None
    bucket: str  # hour | day
    traffic: Traffic
    rewards: Rewards


@router.get(
    "/stats",
    summary="Traffic and reward statistics in a time window",
    response_model=dict,  # serialised as returned (Stats)
)
def get_stats(engine: EngineDep, query: Annotated[StatsQuery, Query()]) -> Stats:
    """Traffic within [since, until) in hour or day buckets (UTC); rewards by policy
    version and by task over all time, and over the window by when trajectories ended."""
    since, until = window(query.since, query.until, query.bucket)
    with engine.connect() as conn:
        return {
            "since": iso(since),
            "until": iso(until),
            "bucket": query.bucket,
            "traffic": traffic_stats.traffic(conn, since=since, until=until, bucket=query.bucket),
            "rewards": traffic_stats.rewards(conn, since=since, until=until, bucket=query.bucket),
        }


@router.get(
    "/learning-curves",
    summary="Mean reward per interaction type over time, with a band",
    response_model=dict,  # serialised as returned (Curves)
)
def get_learning_curves(engine: EngineDep, query: Annotated[CurvesQuery, Query()]) -> Curves:
    """Per interaction type (the 8 with the most graded trajectories), graded trajectories in
    time buckets by when they ended: their count, mean reward with a 95% confidence band
    (mean ± 1.96 standard errors; null for a single one) and success rate (reward >=
    `success_at`). The bucket size (`bucket_seconds`) is the smallest round duration that
    cuts the window (default: from the first graded trajectory to the last) into at most
    `buckets` pieces."""
    with engine.connect() as conn:
        return learning_curves.curves(
            conn,
            buckets=query.buckets,
            success_at=query.success_at,
            since=query.since,
            until=query.until,
        )
