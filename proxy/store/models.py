"""Tables shared by the proxy and the learner.

Invariant: the schema is created and changed only by Alembic revisions in `migrations/`;
these classes describe it for queries and must match the newest revision.
"""

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
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Trajectory(Base):
    """The ordered calls of one episode of one agent run."""

    __tablename__ = "trajectories"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_key: Mapped[str | None] = mapped_column(String(200), index=True)
    task_key: Mapped[str | None] = mapped_column(String(500), index=True)
    # an explicit GRPO group (fan-out: "fanout:<call id>"); the learner groups by it first
    group_key: Mapped[str | None] = mapped_column(String(200), index=True)
    # what kind of interaction: X-Onthejob-Type of its first call, else a fingerprint of that
    # call's harness, system prompt and tools (proxy/interaction.py; migration 0015)
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
    holds the rest. `proxy.store.tokens.materialize_prompts` rebuilds full prompts.
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
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    response: Mapped[dict[str, Any] | None] = mapped_column(JSON)
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
    # "detail": {...}} (proxy/translate/policy.py); null when it did nothing
    compat: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the name of the client key the call came with (never the key): whose traffic it is
    key_name: Mapped[str | None] = mapped_column(String(100))
    # the sampling parameters vLLM applied: the request's, else the replica's defaults
    # (proxy/sampling.py), with "constraints" naming other logits processing; null when
    # the replica's defaults were unknown
    sampling: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_calls_trajectory_started", "trajectory_id", "started_at"),)


class ClientKey(Base):
    """A key clients present to use the model through the proxy (proxy/keys.py).

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
    response: Mapped[dict[str, Any]] = mapped_column(JSON)
    # the conversation (chat messages, instructions excluded) a follow-up continues from
    conversation: Mapped[list[Any]] = mapped_column(JSON)


class Task(Base):
    """A known task: what makes trajectories comparable, and what a good outcome is."""

    __tablename__ = "tasks"

    key: Mapped[str] = mapped_column(String(500), primary_key=True)
    prompt: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    match: Mapped[str] = mapped_column(String(16), default="exact")
    tolerance: Mapped[float] = mapped_column(Float, default=1e-6)
    task_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    # rollout runner (learner/rollout): a learner grader SPEC for this task, a shell command
    # preparing a fresh working directory, and one run there afterwards printing the reward
    grader: Mapped[str | None] = mapped_column(String(500))
    setup: Mapped[str | None] = mapped_column(Text)
    check: Mapped[str | None] = mapped_column(Text)


class Grade(Base):
    """The reward a finished trajectory got, with what the graders said.

    A grading that failed is a row with `error` and no reward: `transient` ones (a judge
    that timed out, a store that was away) are graded again at `retry_at`, with back-off;
    the others stay failed until an operator regrades them (`onthejob regrade`). A row with
    neither reward nor error is a trajectory the learner did not grade because it was too
    stale to train on (`detail` says so).
    """

    __tablename__ = "grades"

    trajectory_id: Mapped[str] = mapped_column(ForeignKey("trajectories.id"), primary_key=True)
    reward: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    graded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # the learner step that trained on it (None: not yet used)
    trained_in_step: Mapped[int | None] = mapped_column(Integer, index=True)
    transient: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class Feedback(Base):
    """A reward posted by the harness owner or an end user."""

    __tablename__ = "feedback"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    trajectory_id: Mapped[str | None] = mapped_column(String(32), index=True)
    session_key: Mapped[str | None] = mapped_column(String(200), index=True)
    reward: Mapped[float] = mapped_column(Float)
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PolicyVersion(Base):
    """Weights that were (or were tried to be) served.

    Only verified versions get an `ordinal` (their place in the staleness order): a version
    that failed verification never served a client and has none, so nothing counts as
    trainable traffic of it.
    """

    __tablename__ = "policy_versions"

    version: Mapped[str] = mapped_column(String(200), primary_key=True)
    ordinal: Mapped[int | None] = mapped_column(Integer, unique=True)
    parent: Mapped[str | None] = mapped_column(String(200))
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # serving | superseded | rolled_back | failed
    status: Mapped[str] = mapped_column(String(16), index=True)
    swap_seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # the verified probe: {"token_ids", "logprobs", "tolerance"}; serving this version again
    # is verified against it, so nobody needs to load the model for a rollback
    probe: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # an operator's pin keeps its checkpoint whatever retention would delete
    # (learner/retention.py); when retention deleted it (the version can serve no more)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    checkpoint_deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class PublishLease(Base):
    """Who is publishing a policy version now (learner, rollback, promote): one at a time.

    A lease, not a lock held by a connection: it expires unless its holder renews it, so a
    publisher killed mid-swap does not block the others for ever.
    """

    __tablename__ = "publish_lease"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(200))
    acquired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SwapGate(Base):
    """A vLLM replica's gate: while closed, no proxy sends it anything.

    The publisher closes it (a new `epoch`), waits until every live proxy has acknowledged
    that epoch with nothing in flight to the replica, swaps and verifies the weights with the
    replica to itself, then opens it with the `version` proxies record from then on.
    """

    __tablename__ = "swap_gates"

    upstream: Mapped[str] = mapped_column(String(500), primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[str | None] = mapped_column(String(200))
    holder: Mapped[str | None] = mapped_column(String(200))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ProxyInstance(Base):
    """A running proxy process: its heartbeat, the replicas it routes to, the gate epochs it
    has acknowledged ({upstream: epoch})."""

    __tablename__ = "proxy_instances"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    upstreams: Mapped[list[Any]] = mapped_column(JSON)
    acks: Mapped[dict[str, Any]] = mapped_column(JSON)


class TrainingStep(Base):
    """One optimizer step of the learner and what it measured."""

    __tablename__ = "training_steps"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)


class LearnerState(Base):
    """Small key/value state the learner resumes from (running baselines, knobs)."""

    __tablename__ = "learner_state"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)


class RolloutRun(Base):
    """One run of a harness command on one task by the rollout runner (learner/rollout).

    Its trajectories are those with this `session_key` (the harness's base URL is
    /s/<session_key>/v1); the runner grades the run and stamps them with the task key and
    `group_key` (same rollout, round, task and policy version), so the learner neither grades
    them itself nor trains on a group before all its runs are done.
    """

    __tablename__ = "rollout_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(String(32), index=True)
    task_set: Mapped[str] = mapped_column(String(200), index=True)
    task_key: Mapped[str] = mapped_column(String(500), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    sample: Mapped[int] = mapped_column(Integer)
    session_key: Mapped[str] = mapped_column(String(200), unique=True)
    group_key: Mapped[str | None] = mapped_column(String(200), index=True)
    eval: Mapped[bool] = mapped_column(Boolean, default=False)
    # running -> ok | failed | timeout | cancelled
    status: Mapped[str] = mapped_column(String(16), index=True)
    command: Mapped[list[Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stdout: Mapped[str | None] = mapped_column(Text)
    stderr: Mapped[str | None] = mapped_column(Text)
    # the working directory's final state: {relative path: text, or a note for binary/big}
    workdir: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    policy_version: Mapped[str | None] = mapped_column(String(200), index=True)
    trajectory_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    reward: Mapped[float | None] = mapped_column(Float)
    grade_detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EvalResult(Base):
    """Success of one policy version on one task of a task set, from one eval rollout."""

    __tablename__ = "eval_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[str] = mapped_column(String(32), index=True)
    task_set: Mapped[str] = mapped_column(String(200), index=True)
    policy_version: Mapped[str | None] = mapped_column(String(200), index=True)
    task_key: Mapped[str] = mapped_column(String(500))
    runs: Mapped[int] = mapped_column(Integer)
    successes: Mapped[int] = mapped_column(Integer)
    mean_reward: Mapped[float] = mapped_column(Float)
    pass_at_1: Mapped[float] = mapped_column(Float)
    # pass@k with k = the group size (the unbiased estimator over `runs` samples)
    k: Mapped[int] = mapped_column(Integer)
    pass_at_k: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Curriculum(Base):
    """Where a curriculum (`onthejob rollout --curriculum`, learner/rollout/curriculum.py)
    stands: its current stage (None once the last stage is passed), so a restart resumes
    there. `stage_rounds` counts the training rounds of the current stage, `last_eval_round`
    the value it had at the stage's last eval."""

    __tablename__ = "curricula"

    name: Mapped[str] = mapped_column(String(80), primary_key=True)
    path: Mapped[str | None] = mapped_column(Text)
    # [{"name", "rule", "replay", "train_tasks", "eval_tasks"}], in order (last loaded)
    stages: Mapped[list[Any]] = mapped_column(JSON)
    stage: Mapped[str | None] = mapped_column(String(80))
    stage_index: Mapped[int | None] = mapped_column(Integer)
    stage_since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stage_rounds: Mapped[int] = mapped_column(Integer, default=0)
    last_eval_round: Mapped[int | None] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CurriculumEval(Base):
    """One eval of a curriculum stage's split (its runs are in rollout_runs and
    eval_results under `rollout_id`): what the stage's promotion rule reads."""

    __tablename__ = "curriculum_evals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    curriculum: Mapped[str] = mapped_column(String(80), index=True)
    stage: Mapped[str] = mapped_column(String(80))
    rollout_id: Mapped[str] = mapped_column(String(32))
    # the version that answered most of its runs
    policy_version: Mapped[str | None] = mapped_column(String(200))
    stage_round: Mapped[int] = mapped_column(Integer)  # the stage's training rounds before it
    runs: Mapped[int] = mapped_column(Integer)  # graded runs
    k: Mapped[int] = mapped_column(Integer)
    # None: no graded run
    pass_at_1: Mapped[float | None] = mapped_column(Float)
    mean_reward: Mapped[float | None] = mapped_column(Float)
    pass_at_k: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class CurriculumPromotion(Base):
    """A curriculum moved on: from a stage whose promotion rule held to the next one
    (`to_stage` None: the last stage was passed), with the version serving and the metrics
    that passed the rule."""

    __tablename__ = "curriculum_promotions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    curriculum: Mapped[str] = mapped_column(String(80), index=True)
    from_stage: Mapped[str] = mapped_column(String(80))
    to_stage: Mapped[str | None] = mapped_column(String(80))
    policy_version: Mapped[str | None] = mapped_column(String(200))
    # {"rule", "value", "evals": [{"rollout_id", "policy_version", "pass_at_1", ...}], ...}
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
