"""Canaries: a new version serving a share of one scope's live traffic beside the version
that serves the rest, until it is promoted or rolled back (store/canaries.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from store.json_types import JsonObject
from store.models.base import Base


class Canary(Base):
    """One canary: its scope (a tenant's name, or "*" for the shared policy), its two arms,
    how traffic is split between them, and how it ended.

    `status`: running -> promoted | rolled_back. At most one runs per scope (the partial
    unique index): a call's scope then has one candidate. `ends_at` is the time limit, at
    which `default_decision` is taken if nothing decided before; an operator may extend it.
    """

    __tablename__ = "canaries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(100))
    candidate: Mapped[str] = mapped_column(String(200))
    # what served the scope when the canary started (null: not known)
    incumbent: Mapped[str | None] = mapped_column(String(200))
    share: Mapped[float] = mapped_column(Float)  # of the scope's sessions the candidate gets
    min_calls: Mapped[int] = mapped_column(Integer)  # per arm, before any decision
    default_decision: Mapped[str] = mapped_column(String(16))  # promote | rollback
    status: Mapped[str] = mapped_column(String(16), index=True)
    started_by: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index(
            "ix_canaries_running_scope",
            "scope",
            unique=True,
            postgresql_where=text("status = 'running'"),
            sqlite_where=text("status = 'running'"),
        ),
    )


class CanaryAction(Base):
    """What was done to a canary, by whom: start, extend, promote, rollback."""

    __tablename__ = "canary_actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    canary_id: Mapped[int] = mapped_column(ForeignKey("canaries.id"), index=True)
    action: Mapped[str] = mapped_column(String(16))
    # an operator's name as the admin API was told it, or "learner"
    by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    detail: Mapped[JsonObject | None] = mapped_column(JSON)


class WatchAlert(Base):
    """One detector of the reward-hacking watch (learner/canary/watch.py) alerting on a
    version against the one it is compared with: a canary's candidate against its
    incumbent, or (`canary_id` null) the newest version of a scope against the one before.

    Raised once, `seen_at` moved on at each look that still finds it, `cleared_at` set at
    the first look that does not: the open rows are what alerts now.
    """

    __tablename__ = "watch_alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    canary_id: Mapped[int | None] = mapped_column(ForeignKey("canaries.id"), index=True)
    scope: Mapped[str] = mapped_column(String(100))  # a tenant's name, or "*"
    version: Mapped[str] = mapped_column(String(200))  # the version under watch
    baseline: Mapped[str | None] = mapped_column(String(200))  # what it is compared with
    detector: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    raised_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
