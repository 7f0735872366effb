"""The control plane of serving: policy versions, the publish lease, the replicas' swap
gates, and the tenants whose calls are served by adapters of their own."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from store.json_types import JsonObject
from store.models.base import Base


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
    # serving | superseded | rolled_back | failed | canary (verified, serving a canary's
    # share of its scope until the canary is decided: store/canaries.py)
    status: Mapped[str] = mapped_column(String(16), index=True)
    swap_seconds: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[JsonObject | None] = mapped_column(JSON)
    # the verified probe: {"token_ids", "logprobs", "tolerance"}; serving this version again
    # is verified against it, so nobody needs to load the model for a rollback
    probe: Mapped[JsonObject | None] = mapped_column(JSON)
    # an operator's pin keeps its checkpoint whatever retention would delete
    # (learner/retention.py); when retention deleted it (the version can serve no more)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    checkpoint_deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the tenant whose adapter lineage the version belongs to; null: the shared policy
    tenant: Mapped[str | None] = mapped_column(String(100), index=True)


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


class SwapRequest(Base):
    """An operator's request to serve a recorded version again (rollback, promote), recorded
    by the admin API and carried out by a running learner (learner/swap/requests.py): the
    proxy process holds no swap code.

    `status`: pending (recorded), running (a learner claimed it), done (`serving` names the
    new version), failed (`error`, with the HTTP status the admin API answers,
    `error_status`), abandoned (no learner claimed it in time; it is never carried out).
    """

    __tablename__ = "swap_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(16))  # rollback | promote
    # how long the swap may wait for the publish lease (a learner's publish in progress)
    lease_wait: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), index=True)
    requested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    serving: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)
    error_status: Mapped[int | None] = mapped_column(Integer)


class Tenant(Base):
    """A team whose calls are answered by a LoRA adapter of its own, trained on its traffic.

    A call belongs to the tenant that lists its client key, else to the one that lists its
    interaction type; a key or a type belongs to one tenant at most. `serving_version` is the
    adapter its calls are sent to (null: the shared policy answers them, as it does a call of
    no tenant, and as it does while no replica has that adapter loaded). `canary`: its own
    canary settings over the learner's (store/tenants.py CanaryOverrides; null: the
    learner's).
    """

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    client_keys: Mapped[list[str]] = mapped_column(JSON)
    interaction_types: Mapped[list[str]] = mapped_column(JSON)
    serving_version: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    canary: Mapped[JsonObject | None] = mapped_column(JSON)
