"""Trajectories out of the store as records (store/trajectory_record.py), with their calls'
full prompts rebuilt from the stored deltas (store/tokens.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from store import clock, recording
from store.tokens import materialize_prompts
from store.trajectory_record import Trajectory, TrajectoryCall


def load_trajectories(
    engine: Engine,
    *,
    session_key: str | None = None,
    since: datetime | None = None,
    ids: list[str] | None = None,
    interaction_type: str | None = None,
) -> Iterator[Trajectory]:
    """The matching trajectories, oldest first; `since` matches any activity after it."""
    with engine.connect() as conn:
        found = recording.trajectories(
            conn,
            session_key=session_key,
            since=since,
            ids=ids,
            interaction_type=interaction_type,
        )
        for row in list(found):
            calls = recording.calls_of(conn, trajectory_id=row["id"])
            prompts = materialize_prompts(calls, lambda ids: recording.calls_by_ids(conn, ids=ids))
            yield Trajectory(
                id=row["id"],
                calls=tuple(call_record(c, prompts[c["id"]]) for c in calls),
                session=row["session_key"],
                task_key=row["task_key"],
                group_key=row["group_key"],
                interaction_type=row["interaction_type"],
                status=row["status"],
                reward=row["reward"],
                started_at=clock.as_utc(row["started_at"]),
                ended_at=clock.as_utc(row["ended_at"]),
            )


def call_record(row: Mapping[str, Any], prompt: list[int] | None) -> TrajectoryCall:
    """A stored call row as the record, with its full prompt (`prompt`)."""
    choices = row.get("choices") or []
    first = choices[0] if choices else {}
    return TrajectoryCall(
        id=row["id"],
        api=row["api"],
        model=row["model"],
        upstream=row["upstream"],
        policy_version=row["policy_version"],
        status=row["status"],
        http_status=row["http_status"],
        error=row["error"],
        stream=row["stream"],
        started_at=clock.as_utc(row["started_at"]),
        request=row["request"],
        response=row["response"],
        prompt_token_ids=prompt,
        completion_token_ids=first.get("token_ids"),
        completion_logprobs=first.get("logprobs"),
        finish_reason=row["finish_reason"],
        capture_complete=row["capture_complete"],
        latency_ms=row["latency_ms"],
        ttft_ms=row["ttft_ms"],
        user_agent=row.get("user_agent"),
        compat=row.get("compat"),
        key_name=row.get("key_name"),
        tenant=row.get("tenant"),
        teacher=row.get("teacher"),
        sampling=row.get("sampling"),
        # the first choice's tokens are above; the export lists all only where there are more
        choices=choices if len(choices) > 1 else None,
    )
