"""Policy versions: list with metrics and rewards; promote or roll back one; pin one.

Both ask the running learner, through the store (proxy/admin/swaps.py), to serve the chosen
version's checkpoint again with the same code as `onthejob rollback`: under the publish
lease, so never at the same time as the learner's own publish or another operator's; a
fenced hot-swap into every upstream, verified against the probe recorded for that version,
and recorded as a new version `VERSION+rollback-N` so staleness keeps counting forwards.
Without a running learner they answer 503 and name `onthejob rollback`.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

from fastapi import APIRouter, Path, Query
from sqlalchemy import Engine

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError
from proxy.admin.schemas import Key
from proxy.admin.swaps import serve_again
from store import policy_versions
from store.clock import iso
from store.json_types import JsonObject, JsonValue
from store.policy_versions import PolicyVersionRow
from store.traffic_stats import RewardSums, reward_by_version

router = APIRouter(tags=["versions"])
VersionKey = Annotated[Key, Path()]


class VersionView(TypedDict):
    version: str
    ordinal: int | None
    parent: str | None
    status: str
    created_at: str | None
    swap_seconds: float | None
    error: str | None
    metrics: JsonObject | None
    has_checkpoint: bool
    pinned: bool
    calls: int
    trajectories_graded: int
    mean_reward: float | None
    guard: JsonValue  # the guard's decision, for a version it rolled back


class VersionList(TypedDict):
    serving: str | None
    items: list[VersionView]


# "from" is a keyword: the functional form
Swapped = TypedDict("Swapped", {"ok": bool, "action": str, "from": str, "serving": str})


class Pinned(TypedDict):
    ok: bool
    version: str
    pinned: bool


def _version_row(
    row: PolicyVersionRow, rewards: dict[str | None, RewardSums], calls: dict[str | None, int]
) -> VersionView:
    reward = rewards.get(row["version"], {})
    return {
        "version": row["version"],
        "ordinal": row["ordinal"],
        "parent": row["parent"],
        "status": row["status"],
        "created_at": iso(row["created_at"]),
        "swap_seconds": row["swap_seconds"],
        "error": row["error"],
        "metrics": row["metrics"],
        "has_checkpoint": bool(row["checkpoint_path"]) and row["checkpoint_deleted_at"] is None,
        "pinned": bool(row["pinned"]),
        "calls": calls.get(row["version"], 0),
        "trajectories_graded": reward.get("trajectories", 0),
        "mean_reward": reward.get("mean_reward"),
        # the regression guard's decision, for a version it rolled back (learner/guard.py)
        "guard": (row["metrics"] or {}).get("guard"),
    }


@router.get(
    "/versions",
    summary="Policy versions, newest first, with metrics and rewards",
    response_model=dict,  # serialised as returned (VersionList)
)
def list_versions(
    engine: EngineDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> VersionList:
    """`mean_reward`: over graded trajectories whose first call that version served."""
    with engine.connect() as conn:
        versions = policy_versions.newest_versions(conn, limit=limit)
        rewards = reward_by_version(conn)
        calls = policy_versions.calls_by_version(conn)
        serving = policy_versions.serving_version(conn)
    return {
        "serving": None if serving is None else serving["version"],
        "items": [_version_row(v, rewards, calls) for v in versions],
    }


async def _swap(state: Any, engine: Engine, version: str, action: str) -> Swapped:
    label = await serve_again(engine, version, action, state.settings.gate_wait)
    return {"ok": True, "action": action, "from": version, "serving": label}


@router.post(
    "/versions/{version}/rollback",
    summary="Serve an earlier version again",
    response_model=dict,  # serialised as returned (Swapped)
)
async def rollback(engine: EngineDep, state: StateDep, version: VersionKey) -> Swapped:
    return await _swap(state, engine, version, "rollback")


@router.post(
    "/versions/{version}/promote",
    summary="Serve any version with a checkpoint",
    response_model=dict,  # serialised as returned (Swapped)
)
async def promote(engine: EngineDep, state: StateDep, version: VersionKey) -> Swapped:
    """Like rollback, but also to a version newer than the serving one (e.g. back to the
    newest after a rollback)."""
    return await _swap(state, engine, version, "promote")


async def _pin(engine: Engine, version: str, pinned: bool) -> Pinned:
    def pin() -> None:
        with engine.begin() as conn:
            policy_versions.pin(conn, version=version, pinned=pinned)

    try:
        await asyncio.to_thread(pin)
    except policy_versions.VersionError as exc:
        raise AdminError(exc.status, str(exc)) from None
    return {"ok": True, "version": version, "pinned": pinned}


@router.put(
    "/versions/{version}/pin",
    summary="Keep a version's checkpoint (retention)",
    response_model=dict,  # serialised as returned (Pinned)
)
async def pin(engine: EngineDep, version: VersionKey) -> Pinned:
    """Checkpoint retention never deletes a pinned version's checkpoint, so it can always be
    rolled back to (learner/retention.py)."""
    return await _pin(engine, version, True)


@router.delete(
    "/versions/{version}/pin",
    summary="Let retention delete it again",
    response_model=dict,  # serialised as returned (Pinned)
)
async def unpin(engine: EngineDep, version: VersionKey) -> Pinned:
    return await _pin(engine, version, False)
