"""The rows of the recording tables as types: what the proxy's writer builds
(proxy/recording/rows.py; times in epoch seconds, as its call log keeps them) and what the
store reads back (store/recording.py; times as datetimes). The columns are
store/models/recording.py's.
"""

from __future__ import annotations

from datetime import datetime
from typing import NotRequired, TypedDict

from store.json_types import JsonObject, JsonValue
from store.trajectory_record import RecordedChoice, RecordedSampling


class CallTokens(TypedDict):
    """What rebuilding a call's prompt reads of its row (store/tokens.py)."""

    id: str
    prompt_parent_id: str | None
    prompt_prefix_len: int
    prompt_token_suffix: list[int] | None
    choices: list[RecordedChoice] | None


class CallColumns(CallTokens):
    """Every column of a call but its start time, whose type depends on who holds it."""

    trajectory_id: str | None
    session_key: str | None
    api: str
    upstream: str | None
    model: str | None
    policy_version: str | None
    stream: bool
    status: str  # ok | error | cancelled
    http_status: int
    error: str | None
    request: JsonObject | None  # the client's body as sent: open JSON
    response: JsonObject | None  # the body the client received
    prompt_len: int | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    capture_complete: bool
    continuation_hash: str | None
    latency_ms: float | None
    ttft_ms: float | None
    user_agent: str | None
    compat: JsonObject | None  # {category: [feature, ...], "detail": {...}}
    key_name: str | None
    tenant: str | None
    teacher: str | None  # the teacher that answered instead of the served policy
    sampling: RecordedSampling | None


class CallRow(CallColumns):
    """A call as the writer builds it."""

    started_at: float  # epoch seconds


class StoredCall(CallColumns):
    """A call as the store reads it back."""

    started_at: datetime


class TrajectoryColumns(TypedDict):
    id: str
    session_key: str | None
    task_key: str | None
    group_key: str | None
    interaction_type: str | None
    status: str  # open | finished


class TrajectoryRow(TrajectoryColumns):
    """A trajectory as the writer builds it: times in epoch seconds."""

    started_at: float
    last_call_at: float
    ended_at: float | None
    new: NotRequired[bool]  # the writer's: first seen in this batch (not a column)


class StoredTrajectory(TrajectoryColumns):
    """A trajectory as the store reads it back."""

    started_at: datetime
    last_call_at: datetime
    ended_at: datetime | None
    reward: float | None


class OpenTrajectory(TypedDict):
    """A session's open trajectory, as the writer's stitching looks it up."""

    id: str
    session_key: NotRequired[str | None]  # where several sessions were looked up at once
    started_at: datetime
    last_call_at: datetime


class FinishedRow(TypedDict):
    """A trajectory to finish."""

    id: str
    ended_at: float  # epoch seconds


class ResponseColumns(TypedDict):
    id: str
    call_id: str
    response: JsonObject
    conversation: list[JsonValue]  # chat messages, instructions excluded


class ResponseRow(ResponseColumns):
    """A Responses-API response to keep, as the writer builds it."""

    created_at: float  # epoch seconds


class StoredResponseRow(ResponseColumns):
    created_at: datetime
