"""Tenants: teams whose calls are answered by LoRA adapters of their own (store/tenants.py).

A call is the tenant's that lists its client key, else the one that lists its interaction
type. Its calls go to the tenant's serving adapter on every replica that has it loaded, and
record the tenant and the version that answered. A change takes effect at once in this
proxy and within `key_poll_interval` seconds in every other proxy on the same store. A
tenant may set its own canary settings (`canary`), which the learner reads when it starts a
canary of one of its versions and when its watch looks at a canary of the tenant's calls.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Path, Response

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.schemas import KeyName, TenantCanaryIn, TenantIn, TenantServingIn
from store import policy_versions
from store import tenants as store
from store.clock import iso
from store.tenants import CanaryOverrides, TenantRow, TenantTraffic

router = APIRouter(tags=["tenants"])
TenantName = Annotated[KeyName, Path()]


NO_TRAFFIC: TenantTraffic = {"graded": 0, "trained": 0, "by_version": []}


class TenantView(TypedDict):
    name: str
    client_keys: list[str]
    interaction_types: list[str]
    serving_version: str | None
    lineage_version: str | None
    steered_by_hand: bool
    loaded_on: list[str]
    canary: CanaryOverrides | None
    created_at: str | None
    updated_at: str | None
    traffic: TenantTraffic


class TenantList(TypedDict):
    items: list[TenantView]


def _row(
    row: TenantRow, state: Any, stats: TenantTraffic | None, lineage: str | None
) -> TenantView:
    version = row["serving_version"]
    return {
        "name": row["name"],
        "client_keys": row["client_keys"],
        "interaction_types": row["interaction_types"],
        "serving_version": version,
        # what its lineage serves (None: the shared policy, before its first version); a
        # pointer set elsewhere by hand is the operator's: the learner leaves the tenant be
        "lineage_version": lineage,
        "steered_by_hand": store.steered_by_hand(version, lineage),
        # the replicas its calls reach the adapter on (as this proxy last read them)
        "loaded_on": [r.url for r in state.pool.replicas if version in r.adapters],
        # its own canary settings over the learner's (null: the learner's)
        "canary": row["canary"],
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        # its graded trajectories, how many a step trained on, and their mean reward per
        # version that served them, in the order the versions served
        "traffic": stats or NO_TRAFFIC,
    }


def _found(engine: Any, state: Any, name: str) -> TenantView:
    with engine.connect() as conn:
        row = store.get_tenant(conn, name)
        if row is None:
            raise not_found("tenant", name)
        stats = store.tenant_stats(conn, name).get(name)
        lineage = policy_versions.serving_name(conn, name)
    return _row(row, state, stats, lineage)


@router.get(
    "/tenants",
    summary="List tenants: their adapters, where loaded, their traffic",
    response_model=dict,  # serialised as returned (TenantList)
)
def list_tenants(engine: EngineDep, state: StateDep) -> TenantList:
    with engine.connect() as conn:
        rows = store.list_tenants(conn)
        stats = store.tenant_stats(conn)
        lineages = {r["name"]: policy_versions.serving_name(conn, r["name"]) for r in rows}
    return {"items": [_row(r, state, stats.get(r["name"]), lineages[r["name"]]) for r in rows]}


@router.get(
    "/tenants/{name}",
    summary="One tenant",
    response_model=dict,  # serialised as returned (TenantView)
)
def get_tenant(engine: EngineDep, state: StateDep, name: TenantName) -> TenantView:
    return _found(engine, state, name)


@router.put(
    "/tenants/{name}",
    summary="Create a tenant, or change which calls are its",
    response_model=dict,  # serialised as returned (TenantView)
)
def put_tenant(
    engine: EngineDep, state: StateDep, name: TenantName, body: TenantIn, response: Response
) -> TenantView:
    """201 when created, 200 when changed (its serving adapter stays). 409 when another
    tenant lists one of its client keys or interaction types: a call has one tenant."""
    try:
        with engine.begin() as conn:
            created = store.put_tenant(
                conn,
                name=name,
                client_keys=body.client_keys,
                interaction_types=body.interaction_types,
                now=datetime.now(UTC),
            )
    except store.TenantConflict as exc:
        field = "client_keys" if exc.field == "client key" else "interaction_types"
        raise AdminError(409, str(exc), param=field) from None
    state.tenants.reload()
    response.status_code = 201 if created else 200
    return _found(engine, state, name)


@router.put(
    "/tenants/{name}/serving",
    summary="Point a tenant's calls at an adapter",
    response_model=dict,  # serialised as returned (TenantView)
)
def set_serving(
    engine: EngineDep, state: StateDep, name: TenantName, body: TenantServingIn
) -> TenantView:
    """The adapter must be loaded on a replica for calls to reach it (`loaded_on`); until
    then, and where it is not, the shared policy answers them."""
    with engine.begin() as conn:
        found = store.set_serving(conn, name=name, version=body.version, now=datetime.now(UTC))
    if not found:
        raise not_found("tenant", name)
    state.tenants.reload()
    return _found(engine, state, name)


@router.put(
    "/tenants/{name}/canary",
    summary="Set a tenant's own canary settings",
    response_model=dict,  # serialised as returned (TenantView)
)
def set_canary(
    engine: EngineDep, state: StateDep, name: TenantName, body: TenantCanaryIn
) -> TenantView:
    """Replaces them: each setting left out is the learner's (`learn --canary-share`, ...;
    the watch's thresholds, the code's), and {} gives it the learner's again. The share
    and the others apply to the canaries the learner starts from then on; the watch's
    thresholds at its next look at any canary of the tenant's calls."""
    with engine.begin() as conn:
        found = store.set_canary(conn, name=name, overrides=body.overrides(), now=datetime.now(UTC))
    if not found:
        raise not_found("tenant", name)
    return _found(engine, state, name)


@router.delete("/tenants/{name}", status_code=204, summary="Delete a tenant")
def delete_tenant(engine: EngineDep, state: StateDep, name: TenantName) -> Response:
    """Its calls go to the shared policy from now on; the calls it made keep its name."""
    with engine.begin() as conn:
        found = store.delete_tenant(conn, name)
    if not found:
        raise not_found("tenant", name)
    state.tenants.reload()
    return Response(status_code=204)
