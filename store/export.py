"""`onthejob export`: trajectories as JSON Lines, one trajectory per line.

This format is a public interface (docs/reference/export-format.md); add fields, never
change one. `to_export` is the one place a trajectory record (store/trajectory_record.py)
becomes it: the export, the admin API, and the `python:` and `command:` graders' input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import IO, Any, NotRequired, TypedDict

import orjson
from sqlalchemy import Engine

from store import clock
from store.json_types import JsonObject
from store.trajectory_loading import load_trajectories
from store.trajectory_record import RecordedChoice, RecordedSampling, Trajectory, TrajectoryCall


class TrajectoryFields(TypedDict):
    """What the export formats say of a trajectory besides its id and its calls."""

    session: str | None
    task_key: str | None
    group_key: str | None
    interaction_type: str | None
    status: str
    reward: float | None
    started_at: str | None  # export_time
    ended_at: str | None


class ExportedCall(TypedDict):
    """A call in the export format (docs/reference/export-format.md)."""

    id: str
    api: str
    model: str | None
    upstream: str | None
    policy_version: str | None
    status: str
    http_status: int | None
    error: str | None
    stream: bool
    started_at: str | None
    request: JsonObject | None
    response: JsonObject | None
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    completion_logprobs: list[float] | None
    finish_reason: str | None
    capture_complete: bool
    latency_ms: float | None
    ttft_ms: float | None
    user_agent: str | None
    compat: JsonObject | None
    key_name: str | None
    tenant: str | None
    teacher: str | None
    sampling: RecordedSampling | None
    choices: NotRequired[list[RecordedChoice]]  # every choice's tokens, where recorded


class ExportedTrajectory(TrajectoryFields):
    """One line of the export: `id` first, then the fields, then `calls`."""

    id: str
    calls: list[ExportedCall]


def export_time(value: datetime | None) -> str | None:
    """A timestamp as the export writes it: ISO 8601, UTC (an offset, never a Z)."""
    value = clock.as_utc(value)
    return None if value is None else value.isoformat()


def to_export(trajectory: Trajectory) -> ExportedTrajectory:
    """The trajectory in the export format."""
    return {
        "id": trajectory.id,
        **trajectory_fields(trajectory),
        "calls": [export_call(c) for c in trajectory.calls],
    }


def trajectory_fields(trajectory: Trajectory) -> TrajectoryFields:
    """What the export formats say of a trajectory besides its id and its calls."""
    return {
        "session": trajectory.session,
        "task_key": trajectory.task_key,
        "group_key": trajectory.group_key,
        "interaction_type": trajectory.interaction_type,
        "status": trajectory.status,
        "reward": trajectory.reward,
        "started_at": export_time(trajectory.started_at),
        "ended_at": export_time(trajectory.ended_at),
    }


def export_call(call: TrajectoryCall) -> ExportedCall:
    out: ExportedCall = {
        "id": call.id,
        "api": call.api,
        "model": call.model,
        "upstream": call.upstream,
        "policy_version": call.policy_version,
        "status": call.status,
        "http_status": call.http_status,
        "error": call.error,
        "stream": call.stream,
        "started_at": export_time(call.started_at),
        "request": call.request,
        "response": call.response,
        "prompt_token_ids": call.prompt_token_ids,
        "completion_token_ids": call.completion_token_ids,
        "completion_logprobs": call.completion_logprobs,
        "finish_reason": call.finish_reason,
        "capture_complete": call.capture_complete,
        "latency_ms": call.latency_ms,
        "ttft_ms": call.ttft_ms,
        "user_agent": call.user_agent,
        "compat": call.compat,
        "key_name": call.key_name,
        "tenant": call.tenant,
        "teacher": call.teacher,
        "sampling": call.sampling,
    }
    if call.choices is not None:
        out["choices"] = call.choices
    return out


def from_export(row: Mapping[str, Any]) -> Trajectory:
    """A trajectory in the export format (an exported line, a hand-written one) as the
    record: `to_export`'s inverse; a field the row leaves out takes the record's default."""
    return Trajectory(
        id=str(row.get("id", "")),
        calls=tuple(_call_from_export(c) for c in row.get("calls") or []),
        session=row.get("session"),
        task_key=row.get("task_key"),
        group_key=row.get("group_key"),
        interaction_type=row.get("interaction_type"),
        status=row.get("status", "finished"),
        reward=row.get("reward"),
        started_at=parse_export_time(row.get("started_at")),
        ended_at=parse_export_time(row.get("ended_at")),
    )


def _call_from_export(row: Mapping[str, Any]) -> TrajectoryCall:
    fields = {k: v for k, v in row.items() if k in TrajectoryCall.__dataclass_fields__}
    return TrajectoryCall(
        **{
            **fields,
            "id": str(row.get("id", "")),
            "api": row.get("api", ""),
            "started_at": parse_export_time(row.get("started_at")),
        }
    )


def parse_export_time(value: str | None) -> datetime | None:
    """An export timestamp (ISO 8601) as an aware datetime (a naive one is UTC); None stays
    None."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def iter_trajectories(
    engine: Engine,
    *,
    session_key: str | None = None,
    since: datetime | None = None,
    ids: list[str] | None = None,
    interaction_type: str | None = None,
) -> Iterator[ExportedTrajectory]:
    """The matching trajectories in the export format, oldest first."""
    found = load_trajectories(
        engine, session_key=session_key, since=since, ids=ids, interaction_type=interaction_type
    )
    return (to_export(t) for t in found)


def write_jsonl(rows: Iterator[ExportedTrajectory], out: IO[bytes]) -> int:
    count = 0
    for row in rows:
        out.write(orjson.dumps(row, option=orjson.OPT_NAIVE_UTC) + b"\n")
        count += 1
    out.flush()
    return count
