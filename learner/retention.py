"""Checkpoint retention: the disk the learner uses stays bounded over any number of steps.

Kept: every checkpoint a version that can still serve or be rolled back to needs: the
serving version, its parent, a canary's candidate, the last `keep_last` verified versions,
and the versions an operator pinned (`onthejob pin`), with the full weights an adapter
among them sits on. The rest is deleted: failed versions, and verified ones that fell out
of the window. Only checkpoints the learner wrote in its own directory are ever deleted;
`base` (version 0 and the KL anchor) never is.

Invariant: a checkpoint is deleted only once no replica can still load it, and never once
its version is pinned. Pruning runs under the publish lease, so no publish or rollback is
reading a checkpoint meanwhile; a pin takes no lock: the store marks a checkpoint deleted
only while its version is unpinned, and pins only one not marked; a full
checkpoint a replica serves was read into memory when it was swapped in, but a LoRA
adapter is read again from its directory whenever vLLM evicts and reloads it, so an adapter
is deleted only once no replica lists it (replicas that cannot be asked keep every adapter).
The store marks a version's checkpoint deleted before its files go, so a rollback refuses
it instead of loading a half-deleted directory.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import Engine

from learner.layout import CheckpointError, is_adapter, served_base
from store import policy_versions
from store.policy_versions import CheckpointVersion

log = logging.getLogger("onthejob.learner")

DEFAULT_KEEP_LAST = 3
BASE = "base"
OPTIMIZER_SUFFIX = ".optimizer.pt"


@dataclass(frozen=True)
class Plan:
    keep: frozenset[Path]  # checkpoint directories kept
    delete: dict[Path, list[str]]  # directory -> the versions whose checkpoint it is


def plan(
    versions: Iterable[CheckpointVersion],
    *,
    checkpoints: Path,
    keep_last: int,
    base_of: Callable[[Path], Path] = served_base,
) -> Plan:
    """What to keep and what to delete, from the store's version rows (pure but for
    `base_of`, which reads an adapter's config for the weights it needs under it)."""
    rows = [v for v in versions if v["checkpoint_path"] and not v.get("checkpoint_deleted_at")]
    verified = sorted((v for v in rows if v["ordinal"] is not None), key=lambda v: v["ordinal"])
    # the newest serving version of each lineage: the shared policy's, each tenant's
    newest = {v.get("tenant"): v for v in verified if v["status"] == "serving"}
    serving = list(newest.values())
    parents = {v["parent"] for v in serving}
    kept = {v["version"] for v in verified[-keep_last:] if keep_last > 0}
    kept |= {v["version"] for v in rows if v["version"] in parents or v.get("pinned")}
    kept |= {v["version"] for v in serving}
    # a canary's candidate: its promotion serves it, and trains on from it
    kept |= {v["version"] for v in verified if v["status"] == policy_versions.CANARY}
    keep = {Path(v["checkpoint_path"]) for v in rows if v["version"] in kept}
    keep |= {_base(path, base_of) for path in keep}
    keep.add(checkpoints / BASE)
    delete: dict[Path, list[str]] = {}
    for v in rows:
        path = Path(v["checkpoint_path"])
        if path not in keep and _owned(path, checkpoints):
            delete.setdefault(path, []).append(v["version"])
    return Plan(keep=frozenset(keep), delete=delete)


def prune(
    engine: Engine,
    *,
    checkpoints: Path,
    keep_last: int,
    upstreams: list[str],
    in_use: Callable[[list[str]], set[str] | None] | None = None,
) -> list[Path]:
    """Delete what `plan` says may go; the directories deleted. The caller holds the
    publish lease. `in_use`: the adapter names the replicas still list (None: unknown)."""
    checkpoints = Path(checkpoints)
    with engine.connect() as conn:
        versions = policy_versions.versions_with_checkpoints(conn)
    decided = plan(versions, checkpoints=checkpoints, keep_last=keep_last)
    delete = dict(decided.delete)
    adapters = {path: names for path, names in delete.items() if _is_adapter(path)}
    if adapters:
        listed = (in_use or registered_adapters)(upstreams)
        for path, names in adapters.items():
            if listed is None or listed & set(names):
                del delete[path]  # a replica may still load it: next time
    if delete:
        with engine.begin() as conn:
            names = [name for names in delete.values() for name in names]
            marked = policy_versions.mark_checkpoints_deleted(conn, versions=names)
        # a version an operator pinned since the plan was read keeps its checkpoint
        delete = {path: names for path, names in delete.items() if set(names) <= marked}
        for path in delete:
            _remove(path)
        log.info("retention: deleted %d checkpoints, keeping %d", len(delete), len(decided.keep))
    # a checkpoint only deleted versions name was being deleted when a learner died: it goes
    live = {Path(v["checkpoint_path"]) for v in versions if not v.get("checkpoint_deleted_at")}
    _sweep_leftovers(checkpoints, decided.keep | live)
    return sorted(delete)


def registered_adapters(upstreams: list[str]) -> set[str] | None:
    """The LoRA adapters any replica lists (None: some replica could not be asked)."""
    names: set[str] = set()
    try:
        with httpx.Client(timeout=10.0) as client:
            for upstream in upstreams:
                response = client.get(upstream + "/v1/models")
                response.raise_for_status()
                names |= {
                    str(m.get("id")) for m in response.json().get("data", []) if m.get("parent")
                }
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return names


def _base(path: Path, base_of: Callable[[Path], Path]) -> Path:
    try:
        return Path(base_of(path))
    except CheckpointError:
        return path  # unreadable adapter config: it needs nothing we could name


def _is_adapter(path: Path) -> bool:
    return is_adapter(path)


def _owned(path: Path, checkpoints: Path) -> bool:
    """A checkpoint the learner wrote in its directory (never --model, never base)."""
    return path.parent == checkpoints and path.name != BASE


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.with_name(path.name + OPTIMIZER_SUFFIX).unlink(missing_ok=True)


def _sweep_leftovers(checkpoints: Path, keep: frozenset[Path]) -> None:
    """What a learner that died mid-step left: half-written checkpoints (`.NAME.tmp-*`,
    `*.optimizer.tmp`), a step's checkpoint saved but never recorded as a version (`step-*`,
    no version names it: it was never served) or marked deleted before its files went,
    optimizer states whose checkpoint is gone."""
    for path in checkpoints.iterdir():
        name = path.name
        if name.startswith(".") and ".tmp-" in name:
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith("step-") and path.is_dir() and path not in keep:
            _remove(path)
        elif name.endswith(".optimizer.tmp"):
            path.unlink(missing_ok=True)
        elif name.endswith(OPTIMIZER_SUFFIX):
            owner = path.with_name(name.removesuffix(OPTIMIZER_SUFFIX))
            if not owner.exists() and owner not in keep:
                path.unlink(missing_ok=True)
