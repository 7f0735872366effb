"""Policy versions: list with metrics and rewards; promote or roll back one; pin one.

Both serve the chosen version's checkpoint again through learner.swap.versions.serve_version (the
same code as `onthejob rollback`): under the publish lease, so never at the same time as the
learner's own publish or another operator's; a fenced hot-swap into every upstream, verified
against the probe recorded for that version (no model is loaded in the proxy for it), and
recorded as a new version `VERSION+rollback-N` so staleness keeps counting forwards.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy import Engine, func, select

from learner.swap.versions import VersionError, pin_version, serve_version
from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError
from proxy.admin.schemas import Key
from proxy.admin.stats import reward_by_version
from proxy.admin.trajectories import iso
from proxy.settings import Settings
from store import policy_versions
from store.models import Call, PolicyVersion

router = APIRouter(tags=["versions"])
VersionKey = Annotated[Key, Path()]


def _version_row(row: dict[str, Any], rewards: dict[str | None, Any], calls: dict[str, int]):
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


@router.get("/versions", summary="Policy versions, newest first, with metrics and rewards")
def list_versions(
    engine: EngineDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> dict[str, Any]:
    """`mean_reward`: over graded trajectories whose first call that version served."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(PolicyVersion.__table__).order_by(PolicyVersion.ordinal.desc()).limit(limit)
        )
        versions = [dict(r._mapping) for r in rows]
        rewards = reward_by_version(conn)
        calls = dict(
            conn.execute(
                select(Call.policy_version, func.count()).group_by(Call.policy_version)
            ).all()
        )
        serving = policy_versions.serving_version(conn)
    return {
        "serving": None if serving is None else serving["version"],
        "items": [_version_row(v, rewards, calls) for v in versions],
    }


# A publish holds the lease while its replicas drain (up to gate_wait) and then swaps and
# verifies: an operator's rollback queues behind it that long rather than failing with 409
# because a long stream was still draining (seen on a loaded machine after a fixed 10 s).
_SWAP_ALLOWANCE = 30.0


def _serve(settings: Settings, engine: Engine, version: str, action: str) -> str:
    wait = settings.gate_wait + _SWAP_ALLOWANCE
    return serve_version(engine, settings.upstreams, version, action=action, lease_wait=wait)


async def _swap(state: Any, engine: Engine, version: str, action: str) -> dict[str, Any]:
    try:
        label = await asyncio.to_thread(_serve, state.settings, engine, version, action)
    except VersionError as exc:
        # 404 unknown, 409 a conflict (another publish, not servable), 502 the verified swap
        # failed (the previous weights keep serving)
        raise AdminError(exc.status, str(exc)) from None
    return {"ok": True, "action": action, "from": version, "serving": label}


@router.post("/versions/{version}/rollback", summary="Serve an earlier version again")
async def rollback(engine: EngineDep, state: StateDep, version: VersionKey) -> dict[str, Any]:
    return await _swap(state, engine, version, "rollback")


@router.post("/versions/{version}/promote", summary="Serve any version with a checkpoint")
async def promote(engine: EngineDep, state: StateDep, version: VersionKey) -> dict[str, Any]:
    """Like rollback, but also to a version newer than the serving one (e.g. back to the
    newest after a rollback)."""
    return await _swap(state, engine, version, "promote")


async def _pin(engine: Engine, version: str, pinned: bool) -> dict[str, Any]:
    try:
        await asyncio.to_thread(pin_version, engine, version, pinned=pinned)
    except VersionError as exc:
        raise AdminError(exc.status, str(exc)) from None
    return {"ok": True, "version": version, "pinned": pinned}


@router.put("/versions/{version}/pin", summary="Keep a version's checkpoint (retention)")
async def pin(engine: EngineDep, version: VersionKey) -> dict[str, Any]:
    """Checkpoint retention never deletes a pinned version's checkpoint, so it can always be
    rolled back to (learner/retention.py)."""
    return await _pin(engine, version, True)


@router.delete("/versions/{version}/pin", summary="Let retention delete it again")
async def unpin(engine: EngineDep, version: VersionKey) -> dict[str, Any]:
    return await _pin(engine, version, False)
