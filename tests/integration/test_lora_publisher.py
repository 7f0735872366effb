"""Adapters published through memory into a fake vLLM (no engine): the replica loads the
memory copy, the checkpoint is on the disk before the record, a failed publish leaves the
serving adapter and its files as they were, copies no replica lists are swept. A tmp
directory stands in for /dev/shm. What only the real engine shows (the weights it holds, the
answers of each adapter): tests/e2e/test_lora_vllm.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from learner.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from learner.swap.adapter_memory import AdapterMemory, AdapterWrite, LoadFrom, adapter_memory
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.orphan_adapters import sweep_memory_copies
from learner.swap.publisher import Fingerprint, Probe, PublishResult
from tests.support.fake_vllm import FakeReplica

PROBE = [5, 6, 7, 8]
BASE = "base-model"


@pytest.fixture
def vllm() -> Iterator[FakeReplica]:
    with FakeReplica(model=BASE) as fake:
        yield fake


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoints"
    (path / "base").mkdir(parents=True)
    return path


def memory_of(checkpoints: Path, tmp_path: Path, load_from: LoadFrom = "auto") -> AdapterMemory:
    shared = tmp_path / "shm"
    shared.mkdir(exist_ok=True)
    memory = adapter_memory(load_from, checkpoints, shared=shared)
    assert memory is not None
    return memory


def adapter(checkpoints: Path, logprob: float) -> AdapterWrite:
    """Writes an adapter whose probe logprob (on the fake replica) is ``logprob``."""

    def write(directory: Path) -> None:
        config = {
            "r": 2,
            "lora_alpha": 4,
            "base_model_name_or_path": str(checkpoints / "base"),
            "probe_logprob": logprob,
        }
        (directory / ADAPTER_CONFIG).write_text(json.dumps(config))
        weights = {"base_model.model.layers.0.q_proj.lora_A.weight": torch.full((2, 4), logprob)}
        save_file(weights, str(directory / ADAPTER_WEIGHTS))

    return write


class Lineage:
    """A publisher and the record of what serves (the tenant's pointer, the store's rows)."""

    def __init__(self, vllm: FakeReplica, memory: AdapterMemory | None, keep: int = 3) -> None:
        self.vllm = vllm
        self.serving: list[str] = []
        self.recorded: list[str] = []
        self.publisher = LoraPublisher(
            [vllm.url],
            probe=Probe(PROBE),
            tolerance=1e-3,
            retries=0,
            check_weights=False,  # the fake has no weight-check extension
            keep=keep,
            label=lambda version, is_adapter: self.serving.append(version),
            memory=memory,
        )

    def publish(
        self, checkpoints: Path, version: str, logprob: float, served: float | None = None
    ) -> PublishResult:
        """``version``, whose trainer expects ``served`` (default: what its files give)."""
        expected = logprob if served is None else served

        def record(result: PublishResult) -> None:
            checkpoint = checkpoints / version
            # the record names a checkpoint on the disk, whole, the very files vLLM loaded
            assert (checkpoint / ADAPTER_WEIGHTS).is_file()
            loaded = Path(self.vllm.paths[version])
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
                assert (checkpoint / name).read_bytes() == (loaded / name).read_bytes()
            self.recorded.append(version)

        return self.publisher.publish(
            checkpoints / version,
            version,
            expected=lambda prompt, completion: [expected] * len(completion),
            commit=record,
            write=adapter(checkpoints, logprob),
        )


def staging_left(*directories: Path) -> list[Path]:
    return [p for d in directories if d.is_dir() for p in d.iterdir() if ".tmp-" in p.name]


def test_the_replica_loads_the_memory_copy_and_the_checkpoint_is_on_disk_before_the_record(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory)
    result = one.publish(checkpoints, "t-step-1-aaaaaa", -1.0)
    assert result.ok and result.error is None, result.error
    assert vllm.paths["t-step-1-aaaaaa"] == str(memory.root / "t-step-1-aaaaaa")
    assert one.recorded == one.serving == ["t-step-1-aaaaaa"]
    assert memory.names() == {"t-step-1-aaaaaa"}
    assert not staging_left(memory.root, checkpoints)


def test_a_load_refused_leaves_the_serving_adapter_and_no_directory_under_the_new_name(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory)
    assert one.publish(checkpoints, "v1", -1.0).ok
    serving_files = {p.name: p.read_bytes() for p in (memory.root / "v1").iterdir()}
    vllm.refuse.add("v2")
    result = one.publish(checkpoints, "v2", -2.0)
    assert not result.ok and "engine refused" in str(result.error)
    assert one.serving == one.recorded == ["v1"] and set(vllm.paths) == {"v1"}
    assert vllm.paths["v1"] == str(memory.root / "v1")
    assert {p.name: p.read_bytes() for p in (memory.root / "v1").iterdir()} == serving_files
    assert memory.names() == {"v1"} and not staging_left(memory.root, checkpoints)


def test_a_probe_that_fails_unloads_the_new_adapter_and_its_copy(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory)
    assert one.publish(checkpoints, "v1", -1.0).ok
    result = one.publish(checkpoints, "v2", -2.0, served=-1.5)  # vLLM is not the trainer
    assert not result.ok and "probe logprobs differ" in str(result.error)
    assert one.serving == ["v1"] and set(vllm.paths) == {"v1"} and memory.names() == {"v1"}
    # a failed version's checkpoint stays on the disk, whole, as it always did
    assert (checkpoints / "v2" / ADAPTER_WEIGHTS).is_file()


def test_memory_that_cannot_take_the_adapter_fails_the_publish_when_asked_for(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path, "memory")
    one = Lineage(vllm, memory)
    assert one.publish(checkpoints, "v1", -1.0).ok
    memory.last_size = 10**18  # the next copy would not fit
    result = one.publish(checkpoints, "v2", -2.0)
    assert not result.ok and "not written to memory" in str(result.error)
    assert one.serving == ["v1"] and set(vllm.paths) == {"v1"} and memory.names() == {"v1"}
    assert not staging_left(memory.root, checkpoints)


def test_auto_publishes_from_the_disk_when_memory_cannot_take_the_adapter(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory)
    memory.last_size = 10**18
    assert one.publish(checkpoints, "v1", -1.0).ok
    assert vllm.paths["v1"] == str(checkpoints.resolve() / "v1") and memory.names() == set()


def test_a_replica_that_cannot_read_memory_gets_the_disk_from_then_on(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    vllm.unreadable.append(memory.root)  # vLLM runs in a container of its own
    one, other = Lineage(vllm, memory), Lineage(vllm, memory)
    with caplog.at_level(logging.WARNING, logger="onthejob.learner"):
        assert one.publish(checkpoints, "a-v1", -1.0).ok
        assert other.publish(checkpoints, "b-v1", -2.0).ok
    assert vllm.paths == {n: str(checkpoints.resolve() / n) for n in ("a-v1", "b-v1")}
    assert not memory.in_use
    assert sum("from the disk from now on" in r.getMessage() for r in caplog.records) == 1


def test_a_replica_that_cannot_read_memory_asked_for_fails_the_publish(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path, "memory")
    one = Lineage(vllm, memory)
    assert one.publish(checkpoints, "v1", -1.0).ok
    vllm.unreadable.append(memory.root)
    result = one.publish(checkpoints, "v2", -2.0)
    assert not result.ok and "cannot read" in str(result.error)
    assert one.serving == ["v1"] and set(vllm.paths) == {"v1"} and memory.names() == {"v1"}


def test_copies_of_adapters_the_replicas_no_longer_list_are_swept(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory, keep=2)
    for step in range(1, 5):
        assert one.publish(checkpoints, f"v{step}", -float(step)).ok
    assert set(vllm.paths) == {"v3", "v4"}  # the publisher's window
    assert memory.names() == {"v1", "v2", "v3", "v4"}
    assert sweep_memory_copies(memory, [vllm.url]) == ["v1", "v2"]
    assert memory.names() == {"v3", "v4"}
    # a replica that cannot be asked: every copy stays
    del vllm.paths["v3"]
    assert sweep_memory_copies(memory, [vllm.url, "http://127.0.0.1:9"], timeout=1) == []
    assert memory.names() == {"v3", "v4"}
    # the checkpoints stay for retention to decide
    assert {f"v{s}" for s in range(1, 5)} <= {p.name for p in checkpoints.iterdir()}


def test_a_rollback_loads_a_memory_copy_of_its_checkpoint(
    vllm: FakeReplica, checkpoints: Path, tmp_path: Path
) -> None:
    memory = memory_of(checkpoints, tmp_path)
    one = Lineage(vllm, memory)
    first = one.publish(checkpoints, "v1", -1.0)
    assert first.ok and one.publish(checkpoints, "v2", -2.0).ok
    result = one.publisher.rollback(
        checkpoints / "v1", "v1+rollback-3", fingerprint=Fingerprint(PROBE, [-1.0] * 3, 1e-3)
    )
    assert result.ok, result.error
    assert vllm.paths["v1+rollback-3"] == str(memory.root / "v1+rollback-3")
    assert one.serving[-1] == "v1+rollback-3"


def test_without_memory_the_checkpoint_is_what_vllm_loads(
    vllm: FakeReplica, checkpoints: Path
) -> None:
    one = Lineage(vllm, None)
    assert one.publish(checkpoints, "v1", -1.0).ok
    assert vllm.paths["v1"] == str(checkpoints.resolve() / "v1")
