"""Policy versions: list with metrics and rewards; promote or roll back one.

Both serve the chosen version's checkpoint again through learner.loop.rollback_to (the same
code as `onthejob rollback`): a verified hot-swap into every upstream, recorded as a new
version `VERSION+rollback-N` so staleness keeps counting forwards. One at a time.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Path, Query
from sqlalchemy import Engine, func, select

from learner import queries
from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.schemas import Key
from proxy.admin.stats import reward_by_version
from proxy.admin.trajectories import iso
from proxy.settings import Settings
from proxy.store.models import Call, PolicyVersion

router = APIRouter(tags=["versions"])
VersionKey = Annotated[Key, Path()]
_swap_lock = asyncio.Lock()


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
        "has_checkpoint": bool(row["checkpoint_path"]),
        "calls": calls.get(row["version"], 0),
        "trajectories_graded": reward.get("trajectories", 0),
        "mean_reward": reward.get("mean_reward"),
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
        serving = queries.serving_version(conn)
    return {
        "serving": None if serving is None else serving["version"],
        "items": [_version_row(v, rewards, calls) for v in versions],
    }


def _check(engine: Engine, version: str, action: str) -> None:
    with engine.connect() as conn:
        target = queries.version(conn, version=version)
        serving = queries.serving_version(conn)
    if target is None:
        raise not_found("policy version", version)
    if not target["checkpoint_path"]:
        raise AdminError(409, f"version {version!r} has no checkpoint to serve")
    if serving is not None and serving["version"] == version:
        raise AdminError(409, f"version {version!r} is already serving")
    if action == "rollback" and serving is not None and target["ordinal"] > serving["ordinal"]:
        raise AdminError(409, f"version {version!r} is newer than the serving one: promote it")


def _serve(settings: Settings, version: str) -> str:
    # imported here: it brings torch, which the proxy needs only for this
    from learner.config import LearnerConfig
    from learner.loop import rollback_to

    config = LearnerConfig(
        database_url=settings.database_url, upstreams=settings.upstreams, model="-"
    )
    return rollback_to(config, version)


async def _swap(state: Any, engine: Engine, version: str, action: str) -> dict[str, Any]:
    if _swap_lock.locked():
        raise AdminError(409, "another promote/rollback is in progress; retry when it is done")
    async with _swap_lock:
        await asyncio.to_thread(_check, engine, version, action)
        try:
            label = await asyncio.to_thread(_serve, state.settings, version)
        except (ValueError, OSError, RuntimeError, httpx.HTTPError) as exc:
            # a failed verified swap: the previous weights keep serving (rollback_to says why)
            raise AdminError(502, f"{action} to {version!r} failed: {exc}") from None
    return {"ok": True, "action": action, "from": version, "serving": label}


@router.post("/versions/{version}/rollback", summary="Serve an earlier version again")
async def rollback(engine: EngineDep, state: StateDep, version: VersionKey) -> dict[str, Any]:
    return await _swap(state, engine, version, "rollback")


@router.post("/versions/{version}/promote", summary="Serve any version with a checkpoint")
async def promote(engine: EngineDep, state: StateDep, version: VersionKey) -> dict[str, Any]:
    """Like rollback, but also to a version newer than the serving one (e.g. back to the
    newest after a rollback)."""
    return await _swap(state, engine, version, "promote")
