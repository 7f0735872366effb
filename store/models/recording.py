"""What the proxy records: trajectories, their calls, client keys, stored Responses-API
responses and the proxies that are running."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.json_types import JsonObject
from store.models.base import Base
from store.trajectory_record import RecordedSampling


class Trajectory(Base):
    """The ordered calls of one episode of one agent run."""

    __tablename__ = "trajectories"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_key: Mapped[str | None] = mapped_column(String(200), index=True)
    task_key: Mapped[str | None] = mapped_column(String(500), index=True)
    # an explicit GRPO group (fan-out: "fanout:<call id>"); the learner groups by it first
    group_key: Mapped[str | None] = mapped_column(String(200), index=True)
    # what kind of interaction: X-Onthejob-Type of its first call, else a fingerprint of that
    # call's harness, system prompt and tools (proxy/recording/interaction.py; migration 0015)
    interaction_type: Mapped[str | None] = mapped_column(String(200), index=True)
    # open -> finished (idle timeout or explicit finish)
    status: Mapped[str] = mapped_column(String(16), default="open")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_call_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reward: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        # the open ones by last call: what the writer's idle sweep reads (repo.finish_idle),
        # whatever the number of finished ones (migration 0014)
        Index(
            "ix_trajectories_open_last_call",
            "last_call_at",
            postgresql_where=text("status = 'open'"),
            sqlite_where=text("status = 'open'"),
        ),
    )


class Call(Base):
    """One HTTP request/response through the proxy, keyed by the proxy's own id.

    Prompt tokens are stored as a delta: the first `prompt_prefix_len` tokens equal the full
    sequence (prompt + first choice's completion) of `prompt_parent_id`; `prompt_token_suffix`
    holds the rest. `store.tokens.materialize_prompts` rebuilds full prompts.
    """

    __tablename__ = "calls"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # looked up through ix_calls_trajectory_started, which leads with it
    trajectory_id: Mapped[str | None] = mapped_column(ForeignKey("trajectories.id"))
    session_key: Mapped[str | None] = mapped_column(String(200))
    api: Mapped[str] = mapped_column(String(32))
    upstream: Mapped[str | None] = mapped_column(String(500))
    model: Mapped[str | None] = mapped_column(String(500))
    policy_version: Mapped[str | None] = mapped_column(String(200), index=True)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    # ok | error | cancelled
    status: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    request: Mapped[JsonObject | None] = mapped_column(JSON)
    response: Mapped[JsonObject | None] = mapped_column(JSON)
    prompt_parent_id: Mapped[str | None] = mapped_column(String(32))
    prompt_prefix_len: Mapped[int] = mapped_column(Integer, default=0)
    prompt_token_suffix: Mapped[list[Any] | None] = mapped_column(JSON)
    prompt_len: Mapped[int | None] = mapped_column(Integer)
    # [{"index", "token_ids", "logprobs", "finish_reason", "capture_complete"}], one per choice
    choices: Mapped[list[Any] | None] = mapped_column(JSON)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    # False when captured token ids disagree with upstream usage: never train on it
    capture_complete: Mapped[bool] = mapped_column(Boolean, default=False)
    # hash of (request messages + first choice's reply): how a later call continues this one
    # (not indexed: stitching is done in the proxy's memory; no query looks it up)
    continuation_hash: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    # the client's User-Agent header: which harness (and release) made the call
    user_agent: Mapped[str | None] = mapped_column(String(500))
    # translated APIs: what the compatibility policy did, {category: [feature, ...],
    # "detail": {...}} (proxy/base/compat_policy.py); null when it did nothing
    compat: Mapped[JsonObject | None] = mapped_column(JSON)
    # the name of the client key the call came with (never the key): whose traffic it is
    key_name: Mapped[str | None] = mapped_column(String(100))
    # the tenant the call was routed for (store/tenants.py); null: none
    tenant: Mapped[str | None] = mapped_column(String(100))
    # the teacher that answered it instead of the served policy (`serve --teacher-url`;
    # its policy_version is null); null: the served policy answered
    teacher: Mapped[str | None] = mapped_column(String(200))
    # the sampling parameters vLLM applied: the request's, else the replica's defaults
    # (proxy/upstream/sampling.py), with "constraints" naming other logits processing; null when
    # the replica's defaults were unknown
    sampling: Mapped[RecordedSampling | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_calls_trajectory_started", "trajectory_id", "started_at"),)


class ClientKey(Base):
    """A key clients present to use the model through the proxy (proxy/base/keys.py).

    The key is `otj_<id>_<secret>`; only its SHA-256 is stored, never the key. A revoked key
    stays (calls still name it), and its name can be given to a new key.
    """

    __tablename__ = "client_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        # one active key per name: the name is what calls record
        Index(
            "ix_client_keys_active_name",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
            sqlite_where=text("revoked_at IS NULL"),
        ),
    )


class StoredResponse(Base):
    """A Responses-API response kept for `previous_response_id` and GET /v1/responses/{id}."""

    __tablename__ = "responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(32), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    response: Mapped[JsonObject] = mapped_column(JSON)
    # the conversation (chat messages, instructions excluded) a follow-up continues from
    conversation: Mapped[list[Any]] = mapped_column(JSON)


class ProxyInstance(Base):
    """A running proxy process: its heartbeat, the replicas it routes to, the gate epochs it
    has acknowledged ({upstream: epoch})."""

    __tablename__ = "proxy_instances"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    upstreams: Mapped[list[Any]] = mapped_column(JSON)
    acks: Mapped[dict[str, int]] = mapped_column(JSON)  # {upstream: gate epoch}
    routes: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)  # {tenant: version}
