"""What the compatibility policy did, per harness: the admin view of `calls.compat`.

Harnesses are told apart by their User-Agent (it names the client and its release, so a new
release that sends something new shows up as its own row). Counts are of calls in the
window; the per-call records are summed in Python, as JSON columns are queried differently
in PostgreSQL and SQLite.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection

from proxy.base.compat_policy import CATEGORIES
from store import call_stats
from store.json_types import JsonValue

# the APIs the compatibility policy translates (the others pass through unchanged)
TRANSLATED_APIS = ("messages", "responses")


class FeatureCount(TypedDict):
    feature: str
    calls: int


class Harness(TypedDict):
    """One harness's calls; a list per policy category (CATEGORIES) of its features."""

    user_agent: str | None
    calls: int
    apis: dict[str, int]  # calls by API
    honoured: list[FeatureCount]
    ignored: list[FeatureCount]
    unknown: list[FeatureCount]
    flattened: list[FeatureCount]
    left_out: list[FeatureCount]
    clamped: list[FeatureCount]
    refused: list[FeatureCount]
    refusals: list[JsonValue]  # the latest refusal messages, at most 5


def by_harness(conn: Connection, *, since: datetime, until: datetime) -> list[Harness]:
    """Per user agent, most calls first: calls by API, then per policy category the features
    and how many calls each was in; `refusals` lists the latest refusal messages."""
    harnesses: dict[str | None, Harness] = {}
    for user_agent, api, calls in call_stats.calls_by_agent_and_api(conn, since=since, until=until):
        harness = harnesses.setdefault(user_agent, _empty(user_agent))
        harness["calls"] += calls
        harness["apis"][api] = calls
    records = call_stats.compat_records(conn, since=since, until=until, apis=TRANSLATED_APIS)
    counts: dict[str | None, dict[str, Counter[str]]] = {}
    for user_agent, compat in records:
        if not isinstance(compat, dict):
            continue
        per_category = counts.setdefault(user_agent, {c: Counter() for c in CATEGORIES})
        for category in CATEGORIES:
            per_category[category].update(set(compat.get(category) or []))
        refused = (compat.get("detail") or {}).get("refused")
        harness = harnesses.setdefault(user_agent, _empty(user_agent))
        if refused and len(harness["refusals"]) < 5:
            harness["refusals"].append(refused)
    for user_agent, per_category in counts.items():
        for category, counter in per_category.items():
            harnesses[user_agent][category] = [
                {"feature": feature, "calls": n}
                for feature, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
            ]
    # most calls first; calls without a User-Agent last among equals
    return sorted(
        harnesses.values(),
        key=lambda h: (-h["calls"], h["user_agent"] is None, h["user_agent"] or ""),
    )


def _empty(user_agent: str | None) -> Harness:
    return cast(
        Harness,
        {
            "user_agent": user_agent,
            "calls": 0,
            "apis": {},
            **{category: [] for category in CATEGORIES},
            "refusals": [],
        },
    )
