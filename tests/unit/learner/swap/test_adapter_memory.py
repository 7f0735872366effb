"""The adapters' memory copies: staged and renamed, the disk when memory cannot hold them,
swept once no replica lists them. A tmp directory stands in for /dev/shm (``shared``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from learner.swap.adapter_memory import (
    AdapterFiles,
    AdapterMemory,
    AdapterWrite,
    NoRoom,
    UnreadableCopy,
    adapter_memory,
    memory_root,
)
from learner.swap.publisher import PublishError

FILES = {"adapter_config.json": b"{}", "adapter_model.safetensors": b"\x00" * 1000}


def fill(directory: Path) -> None:
    for name, data in FILES.items():
        (directory / name).write_bytes(data)


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    shm = tmp_path / "shm"
    shm.mkdir()
    return shm


@pytest.fixture
def memory(shared: Path, tmp_path: Path) -> AdapterMemory:
    built = adapter_memory("auto", tmp_path / "checkpoints", shared=shared)
    assert built is not None
    return built


# -- which memory ---------------------------------------------------------------------------
def test_auto_uses_shared_memory_in_a_directory_of_the_checkpoints_own(
    shared: Path, tmp_path: Path
) -> None:
    one = adapter_memory("auto", tmp_path / "a", shared=shared)
    other = adapter_memory("memory", tmp_path / "b", shared=shared)
    assert one is not None and other is not None
    assert one.in_use and not one.strict and other.strict
    assert one.root.parent == other.root.parent == shared and one.root != other.root
    assert one.root == memory_root(tmp_path / "a", shared) and one.root.is_dir()


def test_auto_falls_back_to_the_disk_and_says_why_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="onthejob.learner"):
        assert adapter_memory("auto", tmp_path / "c", shared=tmp_path / "no-shm") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "from the disk" in lines[0] and "no-shm" in lines[0]


def test_auto_falls_back_where_its_directory_cannot_be_made(shared: Path, tmp_path: Path) -> None:
    # a file where the copies' directory goes: what a read-only /dev/shm does to a mkdir
    memory_root(tmp_path / "c", shared).write_text("")
    assert adapter_memory("auto", tmp_path / "c", shared=shared) is None


def test_memory_asked_for_where_there_is_none_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--lora-load-from memory"):
        adapter_memory("memory", tmp_path / "c", shared=tmp_path / "no-shm")


def test_disk_uses_none_but_still_sweeps_what_an_earlier_run_left(
    shared: Path, tmp_path: Path
) -> None:
    assert adapter_memory("disk", tmp_path / "c", shared=shared) is None
    memory_root(tmp_path / "c", shared).mkdir()
    left = adapter_memory("disk", tmp_path / "c", shared=shared)
    assert left is not None and not left.in_use


# -- a copy ---------------------------------------------------------------------------------
def test_a_copy_is_filled_under_a_staging_name_then_renamed_whole(memory: AdapterMemory) -> None:
    seen: list[list[str]] = []

    def watched(directory: Path) -> None:
        fill(directory)
        # while it is written, nothing is under the version's name
        seen.append(sorted(p.name for p in memory.root.iterdir()))
        assert directory.name.startswith(".v1.tmp-")

    path = memory.write("v1", watched)
    assert path == memory.root / "v1" and contents(path) == FILES
    assert len(seen[0]) == 1 and seen[0][0].startswith(".v1.tmp-")
    assert sorted(p.name for p in memory.root.iterdir()) == ["v1"]
    assert memory.last_size == sum(len(b) for b in FILES.values())
    # a version's files never change: a copy already there is kept, not written again
    assert memory.write("v1", lambda d: pytest.fail("written twice")) == path


def test_a_write_that_fails_leaves_nothing_under_either_name(memory: AdapterMemory) -> None:
    def half(directory: Path) -> None:
        (directory / "adapter_config.json").write_text("{}")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        memory.write("v1", half)
    assert list(memory.root.iterdir()) == []


def test_a_copy_that_would_leave_too_little_room_is_not_written(memory: AdapterMemory) -> None:
    with pytest.raises(NoRoom):
        memory.write("v1", fill, size=10**18)
    assert list(memory.root.iterdir()) == []


def test_a_copy_of_a_checkpoint(memory: AdapterMemory, tmp_path: Path) -> None:
    source = tmp_path / "checkpoints" / "v1"
    source.mkdir(parents=True)
    fill(source)
    assert contents(memory.copy("v1+rollback-2", source)) == FILES


def test_names_that_are_no_single_directory_are_refused(memory: AdapterMemory) -> None:
    for name in ("", "../v1", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            memory.path(name)


# -- the sweep ------------------------------------------------------------------------------
def test_the_sweep_removes_copies_no_replica_lists_and_leftovers(memory: AdapterMemory) -> None:
    for name in ("v1", "v2", "v3"):
        memory.write(name, fill)
    (memory.root / ".v4.tmp-deadbeef").mkdir()  # a writer that died
    assert memory.sweep({"v2", "v3", "other"}) == ["v1"]
    assert memory.names() == {"v2", "v3"}
    assert sorted(p.name for p in memory.root.iterdir()) == ["v2", "v3"]


def test_replicas_not_asked_keep_every_copy(memory: AdapterMemory) -> None:
    memory.write("v1", fill)
    (memory.root / ".v2.tmp-deadbeef").mkdir()
    assert memory.sweep(None) == []
    assert sorted(p.name for p in memory.root.iterdir()) == ["v1"]


# -- one publish's files --------------------------------------------------------------------
def test_a_new_adapter_goes_to_memory_and_its_checkpoint_to_the_disk(
    memory: AdapterMemory, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoints" / "v1"
    checkpoint.parent.mkdir()
    with AdapterFiles(memory, checkpoint, "v1", fill) as files:
        assert files.prepare() == memory.root / "v1"
        files.checkpoint_written()
        assert contents(checkpoint) == FILES == contents(memory.root / "v1")
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["v1"]  # no staging left


def test_a_recorded_adapter_is_copied_from_its_checkpoint(
    memory: AdapterMemory, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "v1"
    checkpoint.mkdir()
    fill(checkpoint)
    with AdapterFiles(memory, checkpoint, "v1+rollback-2") as files:
        assert files.prepare() == memory.root / "v1+rollback-2"
        files.checkpoint_written()  # nothing to write
    assert contents(memory.root / "v1+rollback-2") == FILES


def test_without_memory_the_checkpoint_is_written_and_loaded(tmp_path: Path) -> None:
    with AdapterFiles(None, tmp_path / "v1", "v1", fill) as files:
        assert files.prepare() == tmp_path / "v1"
    assert contents(tmp_path / "v1") == FILES


def failing_in_memory(memory: AdapterMemory) -> AdapterWrite:
    """Writes an adapter, but not into memory (it is full)."""

    def write(directory: Path) -> None:
        if directory.parent == memory.root:
            raise OSError(28, "No space left on device")
        fill(directory)

    return write


def test_auto_loads_from_the_disk_when_memory_cannot_take_it(
    memory: AdapterMemory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with AdapterFiles(memory, tmp_path / "v1", "v1", failing_in_memory(memory)) as files:
        assert files.prepare() == tmp_path / "v1"
    assert contents(tmp_path / "v1") == FILES and list(memory.root.iterdir()) == []
    assert "loads from the disk" in caplog.text and memory.in_use  # the next one tries again


def test_memory_asked_for_fails_the_publish_when_memory_cannot_take_it(
    shared: Path, tmp_path: Path
) -> None:
    memory = adapter_memory("memory", tmp_path / "checkpoints", shared=shared)
    assert memory is not None
    with AdapterFiles(memory, tmp_path / "v1", "v1", failing_in_memory(memory)) as files:
        with pytest.raises(PublishError, match="not written to memory"):
            files.prepare()
    assert list(memory.root.iterdir()) == [] and not (tmp_path / "v1").exists()


def test_a_replica_that_cannot_read_memory_turns_auto_to_the_disk(
    memory: AdapterMemory, tmp_path: Path
) -> None:
    with AdapterFiles(memory, tmp_path / "v1", "v1", fill) as files:
        files.prepare()
        assert files.from_disk(UnreadableCopy("vllm cannot read it")) == tmp_path / "v1"
        assert contents(tmp_path / "v1") == FILES  # written before it is loaded
    assert not memory.in_use  # for every lineage: the memory is theirs too


def test_a_replica_that_cannot_read_memory_asked_for_fails_the_publish(
    shared: Path, tmp_path: Path
) -> None:
    memory = adapter_memory("memory", tmp_path / "checkpoints", shared=shared)
    assert memory is not None
    with AdapterFiles(memory, tmp_path / "v1", "v1", fill) as files:
        files.prepare()
        with pytest.raises(PublishError, match="use auto or disk"):
            files.from_disk(UnreadableCopy("vllm cannot read it"))
    assert memory.in_use


def test_a_checkpoint_that_cannot_be_written_fails_before_the_record(
    memory: AdapterMemory, tmp_path: Path
) -> None:
    (tmp_path / "v1").mkdir()  # a version's checkpoint is immutable: this one is taken
    with AdapterFiles(memory, tmp_path / "v1", "v1", fill) as files:
        files.prepare()
        with pytest.raises(PublishError, match="not written"):
            files.checkpoint_written()
        files.discard()
    assert list(memory.root.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_failed_versions_copy_goes_once_its_checkpoint_is_written(
    memory: AdapterMemory, tmp_path: Path
) -> None:
    with AdapterFiles(memory, tmp_path / "v1", "v1", fill) as files:
        files.prepare()
        files.discard()
    assert memory.names() == set() and contents(tmp_path / "v1") == FILES
