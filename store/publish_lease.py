"""The publish lease's row (learner/swap/lease.py holds, renews and waits for it): one
publisher of policy versions at a time, across processes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from sqlalchemy import Engine, or_, select, update

from store import clock
from store.db import insert_for
from store.models import PublishLease


class LeaseHolder(TypedDict):
    holder: str
    acquired_at: datetime | None
    expires_at: datetime


NAME = "publish"


def claim(
    engine: Engine,
    holder: str,
    *,
    ttl: timedelta,
    steal_prefix: str | None = None,
    is_dead: Callable[[str], bool] = lambda _holder: False,
) -> bool:
    """Take the lease for `ttl` if it is free, expired, `holder`'s own, held by a holder
    `is_dead` says is gone, or (steal_prefix) held by a predecessor. Whether we hold it."""
    now = datetime.now(UTC)
    table = PublishLease.__table__
    with engine.begin() as conn:
        conn.execute(insert_for(conn, table).values(name=NAME).on_conflict_do_nothing())
        free = or_(table.c.holder.is_(None), table.c.expires_at < now, table.c.holder == holder)
        current = conn.execute(select(table.c.holder).where(table.c.name == NAME)).scalar()
        if current is not None and current != holder and is_dead(current):
            # taken only if it is still that holder's when we write
            free = or_(free, table.c.holder == current)
        if steal_prefix is not None:
            free = or_(free, table.c.holder.startswith(steal_prefix, autoescape=True))
        taken = conn.execute(
            update(table)
            .where(table.c.name == NAME, free)
            .values(holder=holder, acquired_at=now, expires_at=now + ttl)
        )
        return taken.rowcount == 1


def renew(engine: Engine, holder: str, *, ttl: timedelta) -> bool:
    now = datetime.now(UTC)
    with engine.begin() as conn:
        result = conn.execute(
            update(PublishLease)
            .where(PublishLease.name == NAME, PublishLease.holder == holder)
            .values(expires_at=now + ttl)
        )
        return result.rowcount == 1


def release(engine: Engine, holder: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(PublishLease)
            .where(PublishLease.name == NAME, PublishLease.holder == holder)
            .values(holder=None, expires_at=None)
        )


def holder(engine: Engine) -> LeaseHolder | None:
    """The current holder, unless the lease is free or expired."""
    with engine.connect() as conn:
        row = conn.execute(select(PublishLease.__table__).where(PublishLease.name == NAME)).first()
    if row is None or row.holder is None:
        return None
    expires = clock.as_utc(row.expires_at)
    if expires < datetime.now(UTC):
        return None
    return {"holder": row.holder, "acquired_at": row.acquired_at, "expires_at": expires}
