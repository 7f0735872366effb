"""Canaries in the store: started, read by every proxy to split a scope's traffic, and
decided (promoted or rolled back) or extended by an operator or the learner.

A scope is a tenant (its calls, its adapter pointer) or the shared policy (the calls of no
tenant), stored as SHARED. At most one canary runs per scope (a unique index backs the check
`start_canary` makes). Every action is kept in `canary_actions` with who took it.

Promoting a tenant's canary points the tenant at the candidate in the same transaction (and
makes it its lineage's serving version where it is one of its lineage's, so the learner
trains on from it); the shared policy's candidate is served by a swap of every replica,
which the caller has done before it records the promotion. A rollback changes nothing that
serves: the calls the candidate answered go back to the incumbent once the proxies read it.
A candidate the learner recorded for its canary (status `canary`) leaves that status at the
decision: serving, superseded (served under another name) or rolled back.
Callers own the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict, cast

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from store import policy_versions, tenants
from store.clock import as_utc, iso
from store.json_types import JsonObject
from store.models import Canary, CanaryAction

SHARED = "*"  # the shared policy's scope: no tenant can be named so
RUNNING, PROMOTED, ROLLED_BACK = "running", "promoted", "rolled_back"
DECISIONS = {"promote": PROMOTED, "rollback": ROLLED_BACK}


@dataclass(frozen=True)
class CanaryRule:
    """What a proxy needs of a running canary to split its scope's traffic."""

    id: int
    tenant: str | None  # None: the shared policy's
    candidate: str
    share: float


class CanaryActionRow(TypedDict):
    """One action taken on a canary, oldest first."""

    action: str  # start | promote | rollback | extend | hold (the watch held its promotion)
    by: str
    reason: str
    at: datetime
    detail: JsonObject | None


class CanaryRow(TypedDict):
    """A canary as `list_canaries` gives it: its columns, its scope as a tenant, its actions."""

    id: int
    candidate: str
    incumbent: str | None
    share: float
    min_calls: int
    default_decision: str
    status: str  # running | promoted | rolled_back
    started_by: str
    started_at: datetime
    ends_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    tenant: str | None  # None: the shared policy's
    actions: list[CanaryActionRow]


class CanaryError(ValueError):
    """Why a canary action was refused; `status`: the admin API's HTTP status."""

    status = 409


class UnknownCanary(CanaryError):
    status = 404


def scope_of(tenant: str | None) -> str:
    return SHARED if tenant is None else tenant


def tenant_of(scope: str) -> str | None:
    return None if scope == SHARED else scope


def start_canary(
    conn: Connection,
    *,
    tenant: str | None,
    candidate: str,
    incumbent: str | None,
    share: float,
    min_calls: int,
    time_limit: timedelta,
    default_decision: str,
    by: str,
    now: datetime,
    reason: str = "",
    detail: JsonObject | None = None,
) -> int:
    """Record a running canary; its id. CanaryError: one runs for the scope already, or the
    candidate is what serves it. `detail`: kept with the start action, beside its limit."""
    if default_decision not in DECISIONS:
        raise ValueError(f"default_decision must be one of {sorted(DECISIONS)}")
    if not 0.0 < share < 1.0:
        raise ValueError("share must be between 0 and 1, both excluded")
    if candidate == incumbent:
        raise CanaryError(f"{candidate!r} already serves {_scope_name(tenant)}")
    scope = scope_of(tenant)
    if _running_id(conn, scope) is not None:
        raise CanaryError(f"a canary runs for {_scope_name(tenant)} already: decide it first")
    values = {
        "scope": scope,
        "candidate": candidate,
        "incumbent": incumbent,
        "share": share,
        "min_calls": min_calls,
        "default_decision": default_decision,
        "status": RUNNING,
        "started_by": by,
        "started_at": now,
        "ends_at": now + time_limit,
    }
    try:
        canary_id = int(conn.execute(insert(Canary).values(**values)).inserted_primary_key[0])
    except IntegrityError as exc:  # started meanwhile by another process
        raise CanaryError(f"a canary runs for {_scope_name(tenant)} already") from exc
    started = {**(detail or {}), "ends_at": iso(values["ends_at"])}
    _act(conn, canary_id, "start", by, reason, now, started)
    return canary_id


def running_for(conn: Connection, tenant: str | None) -> int | None:
    """The id of the canary that runs for the scope (a tenant's, None: the shared policy's)."""
    return _running_id(conn, scope_of(tenant))


def serving_now(conn: Connection, tenant: str | None) -> str | None:
    """What serves the scope, as recorded: the tenant's pointer, else (no pointer, or the
    shared policy's scope) the shared policy's serving version. A canary's incumbent."""
    if tenant is not None:
        found = tenants.get_tenant(conn, tenant)
        if found is not None and found["serving_version"] is not None:
            return found["serving_version"]
    return policy_versions.serving_name(conn)


def running(conn: Connection) -> list[CanaryRule]:
    """Every running canary, by scope."""
    rows = conn.execute(
        select(Canary.id, Canary.scope, Canary.candidate, Canary.share)
        .where(Canary.status == RUNNING)
        .order_by(Canary.scope)
    )
    return [CanaryRule(i, tenant_of(scope), cand, share) for i, scope, cand, share in rows]


def list_canaries(
    conn: Connection,
    *,
    status: str | None = None,
    canary_id: int | None = None,
    limit: int | None = None,
) -> list[CanaryRow]:
    """Newest first, each with its actions in the order they were taken."""
    query = select(Canary.__table__).order_by(Canary.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Canary.status == status)
    if canary_id is not None:
        query = query.where(Canary.id == canary_id)
    rows = [dict(r._mapping) for r in conn.execute(query)]
    actions = _actions(conn, [row["id"] for row in rows])
    for row in rows:
        row["tenant"] = tenant_of(row.pop("scope"))
        for key in ("started_at", "ends_at", "decided_at"):
            row[key] = as_utc(row[key])
        row["actions"] = actions.get(row["id"], [])
    return cast(list[CanaryRow], rows)


def get_canary(conn: Connection, canary_id: int) -> CanaryRow | None:
    found = list_canaries(conn, canary_id=canary_id)
    return found[0] if found else None


def promote(conn: Connection, *, canary_id: int, by: str, reason: str, now: datetime) -> CanaryRow:
    """The candidate serves its scope: a tenant's pointer moves to it here; the shared
    policy's swap is the caller's, done before. UnknownCanary, or CanaryError: decided
    already, or its tenant was deleted."""
    canary = _running(conn, canary_id)
    tenant = canary["tenant"]
    if tenant is not None:
        if not tenants.set_serving(conn, name=tenant, version=canary["candidate"], now=now):
            raise CanaryError(f"tenant {tenant!r} no longer exists: roll the canary back")
        _serve_in_lineage(conn, tenant, canary["candidate"])
    # the shared policy's serves under the swap's name (VERSION+rollback-N)
    policy_versions.end_canary(conn, version=canary["candidate"], status="superseded")
    return _close(conn, canary, PROMOTED, by=by, reason=reason, now=now)


def roll_back(
    conn: Connection, *, canary_id: int, by: str, reason: str, now: datetime
) -> CanaryRow:
    """The canary ends; what serves its scope stays as it is."""
    canary = _running(conn, canary_id)
    policy_versions.end_canary(conn, version=canary["candidate"], status="rolled_back")
    return _close(conn, canary, ROLLED_BACK, by=by, reason=reason, now=now)


def extend(
    conn: Connection,
    *,
    canary_id: int,
    more: timedelta,
    by: str,
    reason: str,
    now: datetime,
) -> CanaryRow:
    """The time limit moves `more` later: from the limit, or from now where it has passed
    (the default decision was not taken yet)."""
    canary = _running(conn, canary_id)
    ends_at = max(canary["ends_at"], now) + more
    conn.execute(update(Canary).where(Canary.id == canary_id).values(ends_at=ends_at))
    detail = {"ends_at": iso(ends_at), "was": iso(canary["ends_at"])}
    _act(conn, canary_id, "extend", by, reason, now, detail)
    found = get_canary(conn, canary_id)
    assert found is not None
    return found


def _serve_in_lineage(conn: Connection, tenant: str, candidate: str) -> None:
    """A candidate of the tenant's own lineage becomes its serving version, so the pointer
    and the lineage agree (else the learner takes the tenant for steered by hand)."""
    row = policy_versions.version(conn, version=candidate)
    if row is not None and row["tenant"] == tenant and row["ordinal"] is not None:
        policy_versions.set_version_status(conn, version=candidate, status="serving")


def _running(conn: Connection, canary_id: int) -> CanaryRow:
    canary = get_canary(conn, canary_id)
    if canary is None:
        raise UnknownCanary(f"no canary {canary_id}")
    if canary["status"] != RUNNING:
        raise CanaryError(f"canary {canary_id} is {canary['status']} already")
    return canary


def _close(
    conn: Connection, canary: CanaryRow, status: str, *, by: str, reason: str, now: datetime
) -> CanaryRow:
    changed = conn.execute(
        update(Canary)
        .where(Canary.id == canary["id"], Canary.status == RUNNING)
        .values(status=status, decided_by=by, decided_at=now, reason=reason)
    )
    if not changed.rowcount:  # decided meanwhile by another process
        raise CanaryError(f"canary {canary['id']} was decided meanwhile")
    action = "promote" if status == PROMOTED else "rollback"
    _act(conn, canary["id"], action, by, reason, now, None)
    found = get_canary(conn, canary["id"])
    assert found is not None
    return found


def _running_id(conn: Connection, scope: str) -> int | None:
    return conn.execute(
        select(Canary.id).where(Canary.scope == scope, Canary.status == RUNNING)
    ).scalar()


def _act(
    conn: Connection,
    canary_id: int,
    action: str,
    by: str,
    reason: str,
    now: datetime,
    detail: JsonObject | None,
) -> None:
    conn.execute(
        insert(CanaryAction).values(
            canary_id=canary_id, action=action, by=by, reason=reason, at=now, detail=detail
        )
    )


def _actions(conn: Connection, ids: list[int]) -> dict[int, list[CanaryActionRow]]:
    found: dict[int, list[CanaryActionRow]] = {}
    if not ids:
        return found
    a = CanaryAction
    rows = conn.execute(
        select(a.canary_id, a.action, a.by, a.reason, a.at, a.detail)
        .where(a.canary_id.in_(ids))
        .order_by(a.id)
    )
    for canary_id, action, by, reason, at, detail in rows:
        found.setdefault(canary_id, []).append(
            {"action": action, "by": by, "reason": reason, "at": as_utc(at), "detail": detail}
        )
    return found


def _scope_name(tenant: str | None) -> str:
    return "the shared policy" if tenant is None else f"tenant {tenant!r}"
