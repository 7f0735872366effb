"""`onthejob export`: trajectories as JSON Lines, one trajectory per line.

This format is a public interface (docs/reference/export-format.md); add fields, never
change one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

import orjson
from sqlalchemy import Engine

from store import clock, recording
from store.tokens import materialize_prompts


def _iso(value: datetime | None) -> str | None:
    value = clock.as_utc(value)
    return None if value is None else value.isoformat()


def export_call(call: dict[str, Any], prompt: list[int] | None) -> dict[str, Any]:
    choices = call.get("choices") or []
    first = choices[0] if choices else {}
    out = {
        "id": call["id"],
        "api": call["api"],
        "model": call["model"],
        "upstream": call["upstream"],
        "policy_version": call["policy_version"],
        "status": call["status"],
        "http_status": call["http_status"],
        "error": call["error"],
        "stream": call["stream"],
        "started_at": _iso(call["started_at"]),
        "request": call["request"],
        "response": call["response"],
        "prompt_token_ids": prompt,
        "completion_token_ids": first.get("token_ids"),
        "completion_logprobs": first.get("logprobs"),
        "finish_reason": call["finish_reason"],
        "capture_complete": call["capture_complete"],
        "latency_ms": call["latency_ms"],
        "ttft_ms": call["ttft_ms"],
        "user_agent": call.get("user_agent"),
        "compat": call.get("compat"),
        "key_name": call.get("key_name"),
        "tenant": call.get("tenant"),
        "sampling": call.get("sampling"),
    }
    if len(choices) > 1:
        out["choices"] = choices
    return out


def iter_trajectories(
    engine: Engine,
    *,
    session_key: str | None = None,
    since: datetime | None = None,
    ids: list[str] | None = None,
    interaction_type: str | None = None,
) -> Iterator[dict[str, Any]]:
    with engine.connect() as conn:
        found = recording.trajectories(
            conn,
            session_key=session_key,
            since=since,
            ids=ids,
            interaction_type=interaction_type,
        )
        for trajectory in list(found):
            calls = recording.calls_of(conn, trajectory_id=trajectory["id"])
            prompts = materialize_prompts(calls, lambda ids: recording.calls_by_ids(conn, ids=ids))
            yield {
                "id": trajectory["id"],
                "session": trajectory["session_key"],
                "task_key": trajectory["task_key"],
                "group_key": trajectory["group_key"],
                "interaction_type": trajectory["interaction_type"],
                "status": trajectory["status"],
                "reward": trajectory["reward"],
                "started_at": _iso(trajectory["started_at"]),
                "ended_at": _iso(trajectory["ended_at"]),
                "calls": [export_call(c, prompts[c["id"]]) for c in calls],
            }


def write_jsonl(rows: Iterator[dict[str, Any]], out: IO[bytes]) -> int:
    count = 0
    for row in rows:
        out.write(orjson.dumps(row, option=orjson.OPT_NAIVE_UTC) + b"\n")
        count += 1
    out.flush()
    return count
