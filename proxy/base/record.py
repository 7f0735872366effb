"""A call's record: everything known about one call, filled in along the request, then
handed to the recorder (proxy/recording/recorder.py), which logs it and writes its rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from proxy.base.capture import Capture, ReplyMessage
from proxy.base.compat_policy import Compat
from store.json_types import JsonObject, JsonValue
from store.trajectory_record import RecordedChoice, RecordedSampling


class StoredResponse(TypedDict):
    """A Responses-API response kept for `previous_response_id` and GET /v1/responses/{id}."""

    id: str
    created_at: float  # epoch seconds
    response: JsonObject
    conversation: list[JsonValue]  # the chat messages a follow-up continues from


class CaptureEntry(TypedDict):
    """A call's token capture, as its log entry holds it."""

    prompt_token_ids: list[int] | None
    choices: list[RecordedChoice]
    reply: ReplyMessage | None  # the first choice's message (chat)
    prompt_tokens: int | None
    completion_tokens: int | None
    complete: bool


class CallEntry(TypedDict):
    """A call as the call log holds it: the plain-JSON form of a CallRecord
    (proxy/recording/rows.py `entry_of`), which the writer builds its rows from."""

    id: str
    api: str
    session_key: str | None
    started_at: float  # epoch seconds
    latency_ms: float | None
    ttft_ms: float | None
    stream: bool
    status: str
    http_status: int
    error: str | None
    task_key: str | None
    interaction_type: str | None
    group_key: str | None
    fanout_parent: str | None
    upstream: str | None
    model: str | None
    policy_version: str | None
    sampling: RecordedSampling | None
    request: JsonObject | None
    response: Any  # the body the client received (see CallRecord.response)
    capture: CaptureEntry | None
    # absent from entries logged before these fields existed
    user_agent: NotRequired[str | None]
    compat: NotRequired[JsonObject | None]
    key_name: NotRequired[str | None]
    tenant: NotRequired[str | None]
    teacher: NotRequired[str | None]
    # only where the conversation is not the request's own `messages`
    chat_messages: NotRequired[list[JsonValue] | None]
    stored_response: NotRequired[StoredResponse]


@dataclass
class CallRecord:
    """Everything known about one call; filled in along the request, then enqueued."""

    id: str
    api: str
    session_key: str | None
    started_at: float
    stream: bool = False
    status: str = "ok"
    http_status: int = 200
    error: str | None = None
    request: JsonObject | None = None
    response: Any = None
    # the conversation as chat messages (translated for Responses/Messages): for stitching
    chat_messages: list[Any] | None = None
    # a Responses-API response to keep
    stored_response: StoredResponse | None = None
    # explicit task key (X-Onthejob-Task); else derived from the first user message
    task_key: str | None = None
    # explicit interaction type (X-Onthejob-Type); else the writer fingerprints the first
    # call of its trajectory (proxy/recording/interaction.py)
    interaction_type: str | None = None
    # per-call working state of the client API's dialect (never stored)
    context: dict[str, Any] = field(default_factory=dict)  # keys and values: the dialect's
    upstream: str | None = None
    model: str | None = None
    policy_version: str | None = None
    # the sampling parameters vLLM applied (proxy/upstream/sampling.py); None: its
    # defaults unknown
    sampling: RecordedSampling | None = None
    capture: Capture | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    # fan-out: the GRPO group of this call's choice. A sibling -- a choice sampled for the
    # client's call but not returned -- names that call in `fanout_parent`; it gets its own
    # trajectory, finished at once, and its prompt is stored by reference to that call.
    group_key: str | None = None
    fanout_parent: str | None = None
    # the client's User-Agent (which harness), and what the compatibility policy did with
    # a translated request (proxy/base/compat_policy.py)
    user_agent: str | None = None
    compat: Compat | None = None
    # the name of the client key that let the call in (proxy/base/keys.py; never the key)
    key_name: str | None = None
    # the tenant the call belongs to (proxy/upstream/tenants.py), whatever answered it
    tenant: str | None = None
    # the teacher that answered it instead of the served policy (proxy/upstream/teacher.py);
    # then policy_version is None
    teacher: str | None = None
