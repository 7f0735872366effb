"""Canaries: a new version serving a share of one scope's sessions beside the version that
serves the rest (store/canaries.py), with how each arm did (store/canary_stats.py), and the
operator's say: start one, promote it, roll it back, or give it more time.

Each action is recorded with who took it: `admin` (the admin token), or `admin:NAME` where
the request names its operator in `by`. Promoting a tenant's canary points the tenant at
the candidate; promoting the shared policy's swaps every replica to it (a swap request the
running learner carries out, as POST /versions/{version}/promote). Rolling back changes
nothing that serves; a full-weight candidate's replicas then serve the incumbent again (the
learner's, learner/loop/publish.py). A change takes effect at once in this proxy and within
`key_poll_interval` seconds in every other proxy on the same store.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine
from typing_extensions import TypedDict

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.routes.watch import AlertView, alert_view
from proxy.admin.schemas import Key, KeyName, Text
from proxy.admin.swaps import serve_again
from proxy.state import ProxyState
from store import canaries as store
from store import canary_stats, policy_versions, tenants, watch_alerts
from store.clock import iso
from store.json_types import JsonObject

router = APIRouter(tags=["canaries"])
CanaryId = Annotated[int, Path(ge=1, le=2**31 - 1)]
YEAR = 365 * 24 * 3600.0


class CanaryActionView(TypedDict):
    """One action taken on a canary (store.CanaryActionRow), its time in ISO 8601."""

    action: str
    by: str
    reason: str
    at: str | None
    detail: JsonObject | None


class CanaryView(TypedDict):
    """A canary as the routes answer it: its row (store.CanaryRow, times in ISO 8601), the
    replicas its candidate is loaded on, how each arm did and the watch's alerts."""

    id: int
    candidate: str
    incumbent: str | None
    share: float
    min_calls: int
    default_decision: str
    status: str  # running | promoted | rolled_back
    started_by: str
    started_at: str | None
    ends_at: str | None
    decided_by: str | None
    decided_at: str | None
    reason: str | None
    tenant: str | None  # None: the shared policy's
    actions: list[CanaryActionView]
    loaded_on: list[str]
    arms: canary_stats.CanaryArms
    alerts: list[AlertView]


class CanaryList(TypedDict):
    items: list[CanaryView]


class Operator(BaseModel):
    """Who takes the action, and why: both recorded with it."""

    model_config = ConfigDict(extra="forbid")

    by: KeyName | None = Field(None, description="the operator's name (recorded as admin:NAME)")
    reason: Text = Field("", max_length=2000)


class CanaryIn(Operator):
    tenant: KeyName | None = Field(
        None, description="the tenant whose calls it shares; null: the shared policy's"
    )
    candidate: Key = Field(
        description="the LoRA adapter (a policy version's name) a share of the sessions go to"
    )
    share: float = Field(0.1, gt=0.0, lt=1.0, description="of the scope's sessions")
    min_calls: int = Field(100, ge=1, le=10**9, description="per arm, before any decision")
    time_limit_s: float = Field(24 * 3600.0, gt=0.0, le=YEAR)
    default_decision: Literal["promote", "rollback"] = Field(
        "rollback", description="taken at the time limit if nothing decided before"
    )


class ExtendIn(Operator):
    seconds: float = Field(gt=0.0, le=YEAR, description="more time before the limit")


def _who(body: Operator) -> str:
    return "admin" if body.by is None else f"admin:{body.by}"


def _view(
    canary: store.CanaryRow,
    arms: canary_stats.CanaryArms,
    alerts: list[watch_alerts.StoredAlert],
    state: ProxyState,
) -> CanaryView:
    return {
        **canary,
        "started_at": iso(canary["started_at"]),
        "ends_at": iso(canary["ends_at"]),
        "decided_at": iso(canary["decided_at"]),
        "actions": [{**a, "at": iso(a["at"])} for a in canary["actions"]],
        # the replicas the candidate's calls reach it on (as this proxy last read them)
        "loaded_on": [r.url for r in state.pool.replicas if canary["candidate"] in r.adapters],
        "arms": arms,
        # the reward-hacking watch's on its candidate (cleared ones included): an open one
        # holds its promotion
        "alerts": [alert_view(a) for a in alerts],
    }


def _with_stats(engine: Engine, state: ProxyState, rows: list[store.CanaryRow]) -> list[CanaryView]:
    now = datetime.now(UTC)
    with engine.connect() as conn:
        alerts = watch_alerts.of_canaries(conn, [row["id"] for row in rows])
        return [
            _view(row, canary_stats.arm_stats(conn, row, now=now), alerts.get(row["id"], []), state)
            for row in rows
        ]


def _found(engine: Engine, state: ProxyState, canary_id: int) -> CanaryView:
    with engine.connect() as conn:
        row = store.get_canary(conn, canary_id)
    if row is None:
        raise not_found("canary", str(canary_id))
    return _with_stats(engine, state, [row])[0]


@router.get(
    "/canaries",
    summary="List canaries, newest first, with how each arm did",
    response_model=dict,  # serialised as returned (CanaryList)
)
def list_canaries(
    engine: EngineDep,
    state: StateDep,
    status: Annotated[Literal["running", "promoted", "rolled_back"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> CanaryList:
    """`arms`: per arm (the candidate, the incumbent) the calls its version answered in the
    canary's scope since it started (until its decision): errors, latency, graded
    trajectories and their rewards, next-turn signals."""
    with engine.connect() as conn:
        rows = store.list_canaries(conn, status=status, limit=limit)
    return {"items": _with_stats(engine, state, rows)}


@router.get(
    "/canaries/{canary_id}",
    summary="One canary",
    response_model=dict,  # serialised as returned (CanaryView)
)
def get_canary(engine: EngineDep, state: StateDep, canary_id: CanaryId) -> CanaryView:
    return _found(engine, state, canary_id)


@router.post(
    "/canaries",
    status_code=201,
    summary="Start a canary",
    response_model=dict,  # serialised as returned (CanaryView)
)
def start_canary(engine: EngineDep, state: StateDep, body: CanaryIn) -> CanaryView:
    """The candidate must be loaded on a replica for calls to reach it (`loaded_on`); its
    arm's calls go to the incumbent elsewhere, and count for it. 409 while a canary runs for
    the scope, or where the candidate already serves it; 404 for an unknown tenant."""
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            canary_id = store.start_canary(
                conn,
                tenant=body.tenant,
                candidate=body.candidate,
                incumbent=_incumbent(conn, state, body.tenant),
                share=body.share,
                min_calls=body.min_calls,
                time_limit=timedelta(seconds=body.time_limit_s),
                default_decision=body.default_decision,
                by=_who(body),
                reason=body.reason,
                now=now,
            )
    except store.CanaryError as exc:
        raise AdminError(exc.status, str(exc)) from None
    state.canaries.reload()
    return _found(engine, state, canary_id)


def _incumbent(conn: Any, state: ProxyState, tenant: str | None) -> str | None:
    """What serves the scope now: the tenant's pointer, else the shared policy's serving
    version as recorded, else as the replicas report it."""
    if tenant is not None:
        found = tenants.get_tenant(conn, tenant)
        if found is None:
            raise not_found("tenant", tenant)
        if found["serving_version"] is not None:
            return str(found["serving_version"])
    shared = policy_versions.serving_name(conn)
    if shared is not None:
        return shared
    reported = [r.policy_version for r in state.pool.replicas if r.policy_version]
    return reported[0] if reported else None


@router.post(
    "/canaries/{canary_id}/promote",
    summary="Promote: the candidate serves its scope",
    response_model=dict,  # serialised as returned (CanaryView)
)
async def promote(
    engine: EngineDep, state: StateDep, canary_id: CanaryId, body: Operator | None = None
) -> CanaryView:
    """A tenant's: its calls go to the candidate from now on. The shared policy's: every
    replica is swapped to the candidate first (a running learner does it; 503 without one,
    404 where the candidate is no recorded version), and the canary runs on if that fails."""
    canary = await asyncio.to_thread(_running, engine, canary_id)
    if canary["tenant"] is None:
        await serve_again(engine, canary["candidate"], "promote", state.settings.gate_wait)
    await asyncio.to_thread(_decide, engine, store.promote, canary_id, body or Operator())
    state.canaries.reload()
    state.tenants.reload()
    return await asyncio.to_thread(_found, engine, state, canary_id)


@router.post(
    "/canaries/{canary_id}/rollback",
    summary="Roll back: the canary ends, nothing moves",
    response_model=dict,  # serialised as returned (CanaryView)
)
def roll_back(
    engine: EngineDep, state: StateDep, canary_id: CanaryId, body: Operator | None = None
) -> CanaryView:
    """Its scope's calls all go to the incumbent again; what serves it is not changed."""
    _decide(engine, store.roll_back, canary_id, body or Operator())
    state.canaries.reload()
    return _found(engine, state, canary_id)


@router.post(
    "/canaries/{canary_id}/extend",
    summary="Give a running canary more time",
    response_model=dict,  # serialised as returned (CanaryView)
)
def extend(engine: EngineDep, state: StateDep, canary_id: CanaryId, body: ExtendIn) -> CanaryView:
    """The time limit moves `seconds` later (from now, where it has passed)."""
    try:
        with engine.begin() as conn:
            store.extend(
                conn,
                canary_id=canary_id,
                more=timedelta(seconds=body.seconds),
                by=_who(body),
                reason=body.reason,
                now=datetime.now(UTC),
            )
    except store.CanaryError as exc:
        raise AdminError(exc.status, str(exc)) from None
    return _found(engine, state, canary_id)


def _running(engine: Engine, canary_id: int) -> store.CanaryRow:
    with engine.connect() as conn:
        canary = store.get_canary(conn, canary_id)
    if canary is None:
        raise not_found("canary", str(canary_id))
    if canary["status"] != store.RUNNING:
        raise AdminError(409, f"canary {canary_id} is {canary['status']} already")
    return canary


def _decide(engine: Engine, decide: Any, canary_id: int, body: Operator) -> None:
    try:
        with engine.begin() as conn:
            decide(
                conn, canary_id=canary_id, by=_who(body), reason=body.reason, now=datetime.now(UTC)
            )
    except store.CanaryError as exc:
        raise AdminError(exc.status, str(exc)) from None
