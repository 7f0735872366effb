"""Next-turn signals by client key, with the one-sided-burst flag (store/turn_signals.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, TypedDict

from fastapi import APIRouter, Query

from proxy.admin.deps import EngineDep
from store import turn_signals
from store.turn_signals import KeySignals

router = APIRouter(tags=["signals"])


class Signals(TypedDict):
    since: str
    keys: list[KeySignals]


@router.get(
    "/signals",
    summary="Next-turn signals per client key, one-sided bursts flagged",
    response_model=dict,  # serialised as returned (Signals)
)
def get_signals(
    engine: EngineDep,
    hours: Annotated[float, Query(gt=0, le=24 * 365, description="the window")] = 24.0,
) -> Signals:
    """Per client key (null: calls without one), the next-turn signals the learner stored
    for the trajectories it graded in the last `hours`: all of them (`signals`, `good`,
    `bad`, `good_share`), the word signals a person types (`words`: corrections, approvals,
    retries, interruptions) and the other keys' word signals (`rest_words`). `flagged`: at
    least 20 word signals, 90% or more of one sign, and the rest of the traffic at least 30
    points less one-sided; `reason` gives the numbers."""
    since = datetime.now(UTC) - timedelta(hours=hours)
    with engine.connect() as conn:
        keys = turn_signals.by_key(conn, since=since)
    return {"since": since.isoformat(), "keys": keys}
