"""A call's record: everything known about one call, filled in along the request, then
handed to the recorder (proxy/recording/recorder.py), which logs it and writes its rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.base.capture import Capture
from proxy.base.compat_policy import Compat


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
    request: dict[str, Any] | None = None
    response: Any = None
    # the conversation as chat messages (translated for Responses/Messages): for stitching
    chat_messages: list[Any] | None = None
    # a Responses-API response to keep: {"id", "created_at", "response", "conversation"}
    stored_response: dict[str, Any] | None = None
    # explicit task key (X-Onthejob-Task); else derived from the first user message
    task_key: str | None = None
    # explicit interaction type (X-Onthejob-Type); else the writer fingerprints the first
    # call of its trajectory (proxy/recording/interaction.py)
    interaction_type: str | None = None
    # per-call working state of the client API's dialect (never stored)
    context: dict[str, Any] = field(default_factory=dict)
    upstream: str | None = None
    model: str | None = None
    policy_version: str | None = None
    # the sampling parameters vLLM applied (proxy/upstream/sampling.py); None: its
    # defaults unknown
    sampling: dict[str, Any] | None = None
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
