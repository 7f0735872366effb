"""A finished trajectory as the learner reads it: the store loads it
(store/trajectory_loading.py), the graders, the next-turn signals, the samples and the export
formats take it, and the export format (store/export.py `to_export`) is its public JSON shape.

The fields are the export format's (docs/reference/export-format.md), with timestamps as
aware datetimes instead of ISO strings. What a call recorded as JSON (its request and
response, in its own API's shape, possibly malformed: refused calls are recorded too) stays
JSON; everything the learner decides on is a typed field. Frozen: a grader or a step reads
a trajectory, never changes it (`dataclasses.replace` makes a changed copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from store.json_types import JsonObject


class RecordedChoice(TypedDict):
    """One sampled choice, token-exact, as the proxy records it (proxy/base/capture.py)."""

    index: int
    token_ids: list[int]
    logprobs: list[float]  # one per token
    finish_reason: str | None


class RecordedSampling(TypedDict, total=False):
    """The sampling vLLM applied to a call, as the proxy records it
    (proxy/upstream/sampling.py); a parameter left out (or None) is vLLM's neutral one."""

    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    constraints: list[str]  # the request's other logits processing (logit bias, ...)


@dataclass(frozen=True)
class TrajectoryCall:
    """One recorded call; the defaults are what a call that recorded nothing of it holds."""

    id: str
    api: str  # chat.completions | completions | responses | messages | gemini
    model: str | None = None
    upstream: str | None = None
    policy_version: str | None = None  # the vLLM weight version that served it
    status: str = "ok"  # ok | error | cancelled
    http_status: int | None = None
    error: str | None = None
    stream: bool = False
    started_at: datetime | None = None
    request: JsonObject | None = None  # the client's body as sent
    response: JsonObject | None = None  # the body the client received
    # the full prompt as vLLM tokenised it; None when unknown (never captured, or its parent
    # call is missing from the store)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None  # the first choice's
    completion_logprobs: list[float] | None = None  # one per completion token
    finish_reason: str | None = None
    capture_complete: bool = False  # token ids agree with vLLM's usage: trainable
    latency_ms: float | None = None
    ttft_ms: float | None = None
    user_agent: str | None = None
    compat: JsonObject | None = None  # what the compatibility policy did
    key_name: str | None = None  # the client key's name: whose traffic it is
    tenant: str | None = None
    # the teacher that answered instead of the served policy (its name; policy_version is
    # None): a supervised example for the student, never an on-policy sample
    teacher: str | None = None
    sampling: RecordedSampling | None = None  # None: the replica's defaults were unknown
    # every choice, only where the call asked for several (n > 1)
    choices: list[RecordedChoice] | None = None


@dataclass(frozen=True)
class Trajectory:
    """One episode of one agent run: its calls in order, and what the store knows of it."""

    id: str
    calls: tuple[TrajectoryCall, ...] = ()
    session: str | None = None
    task_key: str | None = None
    group_key: str | None = None  # an explicit GRPO group (fan-out, a rollout)
    interaction_type: str | None = None
    status: str = "finished"
    reward: float | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
