"""Checkpoint retention: over 50 steps the checkpoint directory stays bounded, and every
version that can still serve or be rolled back to keeps its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine

from learner.retention import plan, prune
from learner.swap.versions import serve_version
from store import policy_versions
from store.policy_versions import VersionError

KEEP_LAST = 3


def write_checkpoint(directory: Path, *, adapter_of: Path | None = None) -> Path:
    directory.mkdir()
    if adapter_of is None:
        (directory / "model.safetensors").write_bytes(b"weights")
    else:
        config = {"base_model_name_or_path": str(adapter_of)}
        (directory / "adapter_config.json").write_text(json.dumps(config))
    optimizer = directory.with_name(directory.name + ".optimizer.pt")
    optimizer.write_bytes(b"moments")
    return directory


def publish(engine: Engine, version: str, path: Path, parent: str | None, *, ok: bool) -> None:
    with engine.begin() as conn:
        policy_versions.add_version(
            conn,
            version=version,
            ordinal=policy_versions.next_ordinal(conn) if ok else None,
            parent=parent,
            checkpoint_path=str(path),
            status="serving" if ok else "rolled_back",
        )


def pin(engine: Engine, version: str) -> None:
    with engine.begin() as conn:
        policy_versions.pin(conn, version=version, pinned=True)


def five_steps(engine: Engine, tmp_path: Path) -> Path:
    """base and step-1..5, each verified in turn; the checkpoint directory."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    publish(engine, "v0", write_checkpoint(checkpoints / "base"), None, ok=True)
    for step in range(1, 6):
        publish(
            engine, f"step-{step}", write_checkpoint(checkpoints / f"step-{step}"), None, ok=True
        )
    return checkpoints


def step_dirs(checkpoints: Path) -> set[str]:
    return {p.name for p in checkpoints.iterdir() if p.is_dir()}


def test_fifty_steps_keep_the_directory_bounded(engine: Engine, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    publish(engine, "v0", write_checkpoint(checkpoints / "base"), None, ok=True)
    serving, pinned = "v0", set()
    for step in range(1, 51):
        version = f"step-{step}"
        path = write_checkpoint(checkpoints / version)
        ok = step % 7 != 0  # every seventh step fails verification: the parent serves on
        publish(engine, version, path, serving, ok=ok)
        if ok:
            serving = version
        if step == 10:
            pin(engine, "step-8")
            pinned.add("step-8")
        if step == 30:
            # an operator rolls back to step-27: its checkpoint serves again, as a new version
            publish(engine, "step-27+rollback", checkpoints / "step-27", serving, ok=True)
            serving = "step-27+rollback"
        prune(engine, checkpoints=checkpoints, keep_last=KEEP_LAST, upstreams=[])
        # base, the last K verified, the serving one's parent, the pins
        assert len(step_dirs(checkpoints)) <= 1 + KEEP_LAST + 1 + len(pinned), step
        with engine.connect() as conn:
            current = policy_versions.serving_version(conn)
            assert current is not None and current["parent"] is not None
            parent = policy_versions.version(conn, version=current["parent"])
        # what serves, and what it rolls back to, can be loaded
        assert parent is not None and Path(parent["checkpoint_path"]).exists()
        assert Path(current["checkpoint_path"]).exists()
    # the last three verified (49 failed), the pinned one, base
    assert step_dirs(checkpoints) == {"base", "step-8", "step-47", "step-48", "step-50"}
    # an optimizer state goes with its checkpoint
    optimizers = {p.name for p in checkpoints.glob("*.optimizer.pt")}
    assert optimizers == {f"{d}.optimizer.pt" for d in step_dirs(checkpoints)}
    # a deleted version cannot be served again; the store says why
    with pytest.raises(VersionError, match="retention deleted"):
        serve_version(engine, [], "step-20")
    with pytest.raises(VersionError, match="deleted already"):
        pin(engine, "step-20")


def test_leftovers_of_a_crashed_save_go_too(engine: Engine, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    publish(engine, "v0", write_checkpoint(checkpoints / "base"), None, ok=True)
    (checkpoints / ".step-3-ab12cd.tmp-1234abcd").mkdir()
    write_checkpoint(checkpoints / "step-3-ab12cd")  # saved, then the learner died
    (checkpoints / "step-3-ab12cd.optimizer.tmp").write_bytes(b"half")
    (checkpoints / "step-2-ffffff.optimizer.pt").write_bytes(b"its checkpoint is gone")
    prune(engine, checkpoints=checkpoints, keep_last=KEEP_LAST, upstreams=[])
    assert sorted(p.name for p in checkpoints.iterdir()) == ["base", "base.optimizer.pt"]


def test_a_delete_a_dying_learner_left_half_done_is_finished(
    engine: Engine, tmp_path: Path
) -> None:
    checkpoints = five_steps(engine, tmp_path)
    # the store had marked step-1 deleted, then the learner was killed before its files went
    with engine.begin() as conn:
        policy_versions.mark_checkpoints_deleted(conn, versions=["step-1"])
    prune(engine, checkpoints=checkpoints, keep_last=KEEP_LAST, upstreams=[])
    assert step_dirs(checkpoints) == {"base", "step-3", "step-4", "step-5"}
    assert not (checkpoints / "step-1.optimizer.pt").exists()


def test_an_adapter_a_replica_lists_is_kept_until_it_is_unloaded(
    engine: Engine, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    base = write_checkpoint(checkpoints / "base")
    publish(engine, "v0", base, None, ok=True)
    for step in range(1, 6):
        adapter = write_checkpoint(checkpoints / f"step-{step}", adapter_of=base)
        publish(engine, f"step-{step}", adapter, f"step-{step - 1}", ok=True)

    def listed(names: set[str] | None):
        return lambda upstreams: names

    # vLLM may read an adapter it still lists again: kept while listed, or while unknown
    prune(engine, checkpoints=checkpoints, keep_last=1, upstreams=["x"], in_use=listed(None))
    assert {"step-1", "step-2", "step-3"} <= step_dirs(checkpoints)
    prune(engine, checkpoints=checkpoints, keep_last=1, upstreams=["x"], in_use=listed({"step-2"}))
    assert step_dirs(checkpoints) == {"base", "step-2", "step-4", "step-5"}
    prune(engine, checkpoints=checkpoints, keep_last=1, upstreams=["x"], in_use=listed(set()))
    assert step_dirs(checkpoints) == {"base", "step-4", "step-5"}


def test_the_plan_keeps_what_can_serve_or_be_rolled_back_to(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"

    def row(version: str, ordinal: int | None, status: str, **extra: object) -> dict:
        path = extra.pop("path", str(root / version))
        return {
            "version": version,
            "ordinal": ordinal,
            "status": status,
            "parent": None,
            "checkpoint_path": path,
            **extra,
        }

    rows = [
        row("v0", 0, "superseded", path=str(tmp_path / "model")),  # --model: never ours
        row("a", 1, "superseded", pinned=True),
        row("b", 2, "superseded"),
        row("c", 3, "superseded"),
        row("failed", None, "rolled_back", parent="c"),
        row("d", 4, "superseded"),
        row("e", 5, "superseded"),
        row("b+rollback-6", 6, "serving", parent="e", path=str(root / "b")),
    ]
    decided = plan(rows, checkpoints=root, keep_last=2, base_of=lambda p: p)
    assert sorted(p.name for p in decided.delete) == ["c", "d", "failed"]
    assert {root / n for n in ("a", "b", "e", "base")} <= decided.keep


def test_every_tenant_keeps_the_adapter_that_serves_it(tmp_path: Path) -> None:
    """Each lineage has a serving version (learn --tenants): retention keeps all of them,
    and their parents, however far back the other tenants' steps pushed them."""
    root = tmp_path / "checkpoints"

    def row(version: str, ordinal: int, status: str, tenant: str | None, **extra: object):
        return {
            "version": version,
            "ordinal": ordinal,
            "status": status,
            "parent": extra.get("parent"),
            "checkpoint_path": str(root / version),
            "tenant": tenant,
        }

    rows = [
        row("base", 0, "serving", None),
        row("a-1", 1, "superseded", "a"),
        row("a-2", 2, "serving", "a", parent="a-1"),
        row("b-3", 3, "superseded", "b"),
        row("b-4", 4, "superseded", "b"),
        row("b-5", 5, "serving", "b"),
    ]
    decided = plan(rows, checkpoints=root, keep_last=1, base_of=lambda p: p)
    assert sorted(p.name for p in decided.delete) == ["b-3", "b-4"]
    assert {root / n for n in ("base", "a-1", "a-2", "b-5")} <= decided.keep


def test_a_pin_that_lands_while_retention_decides_keeps_its_checkpoint(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pin takes no lock: the store marks only unpinned checkpoints deleted."""
    checkpoints = five_steps(engine, tmp_path)
    read = policy_versions.versions_with_checkpoints

    def read_then_pin(conn):  # type: ignore[no-untyped-def]
        rows = read(conn)
        pin(engine, "step-1")  # an operator, after retention read step-1 as unpinned
        return rows

    monkeypatch.setattr(policy_versions, "versions_with_checkpoints", read_then_pin)
    prune(engine, checkpoints=checkpoints, keep_last=KEEP_LAST, upstreams=[])
    assert step_dirs(checkpoints) == {"base", "step-1", "step-3", "step-4", "step-5"}
    with engine.connect() as conn:
        assert policy_versions.version(conn, version="step-1")["checkpoint_deleted_at"] is None
        assert policy_versions.version(conn, version="step-2")["checkpoint_deleted_at"] is not None
