"""bench/gpu_transfer.py, the weight transfer of the prepared GPU check: its buckets, its
fall-back from the collective to IPC (saying why), and the IPC way for real (shared memory
on the CPU). The gloo broadcast runs in tests/e2e/test_gpu_check_bench.py."""

from __future__ import annotations

import pytest

from bench import gpu_transfer
from bench.gpu_transfer import Plan, TransferError, buckets_of, measure


def plan(**changes: object) -> Plan:
    settings: dict = {
        "shapes": [[64, 32], [1000], [8, 8, 8], [16]],
        "device": "cpu",
        "bucket_bytes": 4096,
        "warmup": 0,
        "repeats": 1,
        "timeout_s": 60.0,
    }
    return Plan(**{**settings, **changes})


def test_buckets_keep_the_order_and_a_larger_tensor_goes_alone() -> None:
    # bf16: 4096 B, 2000 B, 1024 B, 32 B against buckets of 4096 B
    assert buckets_of(plan()) == [[0], [1, 2, 3]]
    assert buckets_of(plan(bucket_bytes=1)) == [[0], [1], [2], [3]]
    assert buckets_of(plan(bucket_bytes=1 << 20)) == [[0, 1, 2, 3]]
    assert plan().nbytes == (2048 + 1000 + 512 + 16) * 2


def test_where_the_collective_fails_ipc_is_measured_and_the_reason_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ways: list[str] = []

    def run(_: Plan, way: str) -> list[float]:
        ways.append(way)
        if way == "collective":
            raise TransferError("rank 1: DistBackendError: Duplicate GPU detected")
        return [0.5]

    monkeypatch.setattr(gpu_transfer, "_run", run)
    outcome = measure(plan())
    assert ways == ["collective", "ipc"]
    assert outcome.way == "shared-memory" and outcome.seconds == [0.5]
    assert outcome.refused == "gloo failed: rank 1: DistBackendError: Duplicate GPU detected"
    assert outcome.gbps == pytest.approx(plan().nbytes / 0.5 / 1e9)
    with pytest.raises(TransferError, match="Duplicate GPU"):
        measure(plan(way="collective"))  # asked for alone: no fall-back


def test_the_ipc_way_hands_the_weights_over_exactly() -> None:
    outcome = measure(plan(way="ipc", repeats=2))  # the sums are checked inside
    assert outcome.way == "shared-memory" and outcome.refused is None
    assert len(outcome.seconds) == 2 and outcome.gbps > 0 and outcome.copy_gbps > 0
