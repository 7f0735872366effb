"""Swap gates and proxy instances in the store: how a publisher keeps every proxy off a
replica while it swaps weights.

Invariant (with proxy/upstream/gates.py, the proxy's side, and learner/swap/fence.py, the
publisher's): once every live proxy has acknowledged epoch E of an upstream's gate, none
of them has a request in flight to it, and none sends it one until the gate opens. A proxy
registers before it reads the gates, so a proxy that starts while a gate is closed sees it
closed.
Callers own the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TypedDict, cast

from sqlalchemy import Connection, delete, select, update

from store.db import insert_for
from store.models import ProxyInstance, SwapGate


class InstanceRow(TypedDict):
    """A live proxy's row."""

    id: str
    host: str
    started_at: datetime
    seen_at: datetime
    upstreams: list[str]
    acks: dict[str, int]  # {upstream: gate epoch}
    routes: dict[str, str] | None  # {tenant: version}


class GateRow(TypedDict):
    """An upstream's swap gate."""

    upstream: str
    epoch: int
    closed: bool
    version: str | None
    holder: str | None
    updated_at: datetime


# a proxy that has not reported for this long is gone (killed, or cut off from the store)
PROXY_TTL = timedelta(seconds=10)


def register(
    conn: Connection,
    *,
    instance_id: str,
    host: str,
    upstreams: Sequence[str],
    acks: dict[str, int],
    now: datetime,
    routes: dict[str, str] | None = None,
) -> None:
    """This proxy is alive, routes to `upstreams`, has acknowledged these gate epochs and
    sends these tenants' calls to these adapters."""
    table = ProxyInstance.__table__
    values = {
        "id": instance_id,
        "host": host,
        "started_at": now,
        "seen_at": now,
        "upstreams": list(upstreams),
        "acks": dict(acks),
        "routes": dict(routes or {}),
    }
    stmt = insert_for(conn, table).values(values)
    changed = {
        "seen_at": now,
        "upstreams": list(upstreams),
        "acks": dict(acks),
        "routes": dict(routes or {}),
    }
    conn.execute(stmt.on_conflict_do_update(index_elements=["id"], set_=changed))


def forget(conn: Connection, *, instance_id: str) -> None:
    """A proxy that stops cleanly leaves at once, so no publisher waits for it."""
    conn.execute(delete(ProxyInstance).where(ProxyInstance.id == instance_id))


def live_instances(conn: Connection, *, now: datetime) -> list[InstanceRow]:
    rows = conn.execute(
        select(ProxyInstance.__table__).where(ProxyInstance.seen_at >= now - PROXY_TTL)
    )
    return [cast(InstanceRow, dict(r._mapping)) for r in rows]


def routed_everywhere(conn: Connection, *, tenant: str, version: str, now: datetime) -> bool:
    """Every live proxy sends `tenant`'s calls to `version` (True with no proxy running)."""
    return all(
        (proxy["routes"] or {}).get(tenant) == version for proxy in live_instances(conn, now=now)
    )


def read_gates(conn: Connection) -> dict[str, GateRow]:
    """upstream -> {"epoch", "closed", "version", "holder"}."""
    rows = conn.execute(select(SwapGate.__table__))
    return {r.upstream: cast(GateRow, dict(r._mapping)) for r in rows}


def close_gate(conn: Connection, *, upstream: str, holder: str, now: datetime) -> int:
    """Close `upstream`'s gate under a new epoch; that epoch."""
    table = SwapGate.__table__
    stmt = insert_for(conn, table).values(
        upstream=upstream, epoch=1, closed=True, version=None, holder=holder, updated_at=now
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["upstream"],
            set_={"epoch": table.c.epoch + 1, "closed": True, "holder": holder, "updated_at": now},
        )
    )
    return int(conn.execute(select(table.c.epoch).where(table.c.upstream == upstream)).scalar_one())


def open_gate(conn: Connection, *, upstream: str, version: str | None, now: datetime) -> None:
    """Open it again; proxies record `version` (what the replica serves now) from then on."""
    conn.execute(
        update(SwapGate)
        .where(SwapGate.upstream == upstream)
        .values(closed=False, version=version, holder=None, updated_at=now)
    )


def closed_gates(conn: Connection) -> list[GateRow]:
    return [g for g in read_gates(conn).values() if g["closed"]]
