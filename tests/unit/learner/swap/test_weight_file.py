"""A replica's weight file (learner/swap/weight_file.py): whole writes, deltas, and what it
holds after a failure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from learner.swap.weight_file import INDEX_BYTES, WeightFile, file_for


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "a.weight": torch.randn(64, 32, generator=generator).to(torch.bfloat16),
        "b.bias": torch.randn(7, generator=generator),  # float32, an odd size
        "c.weight": torch.randn(16, 16, generator=generator).to(torch.bfloat16),
    }


def read_back(weight_file: WeightFile) -> dict[str, torch.Tensor]:
    buffer = torch.from_file(
        str(weight_file.path), shared=False, size=weight_file.size, dtype=torch.uint8
    )
    info = weight_file.update_info()
    out = {}
    for name, dtype, shape, offset in zip(
        info["names"], info["dtype_names"], info["shapes"], info["offsets"], strict=True
    ):
        dt = getattr(torch, dtype)
        count = torch.Size(shape).numel()
        out[name] = buffer[offset : offset + count * dt.itemsize].view(dt).view(shape).clone()
    return out


def test_a_full_write_lays_out_every_tensor_aligned_and_exactly(tmp_path: Path) -> None:
    weight_file = WeightFile(tmp_path / "r.weights")
    source = tensors()

    stats = weight_file.write(source, "v1")

    assert stats.full and stats.bytes_sent == stats.bytes_full
    assert stats.changed == stats.elements == sum(t.numel() for t in source.values())
    assert all(slot.offset % 64 == 0 for slot in weight_file.layout.values())
    assert weight_file.version == "v1"
    for name, tensor in read_back(weight_file).items():
        assert torch.equal(tensor, source[name])


def test_a_delta_writes_only_the_changed_elements_and_counts_them(tmp_path: Path) -> None:
    weight_file = WeightFile(tmp_path / "r.weights")
    weight_file.write(tensors(), "v1")
    changed = tensors()
    changed["a.weight"].view(-1)[[3, 100, 2047]] += 1.0
    changed["c.weight"].view(-1)[:200] = 0.5  # most of it: the whole tensor is cheaper

    stats = weight_file.write(changed, "v2", delta=True)

    assert not stats.full
    assert stats.changed == 3 + int((tensors()["c.weight"].view(-1)[:200] != 0.5).sum())
    assert stats.bytes_sent == 3 * (INDEX_BYTES + 2) + 16 * 16 * 2
    for name, tensor in read_back(weight_file).items():
        assert torch.equal(tensor, changed[name])


def test_after_a_failure_or_with_another_layout_the_next_write_is_whole(tmp_path: Path) -> None:
    weight_file = WeightFile(tmp_path / "r.weights")
    weight_file.write(tensors(), "v1")
    weight_file.forget()
    assert weight_file.write(tensors(1), "v2", delta=True).full

    grown = {**tensors(2), "d.weight": torch.ones(3, 3)}
    stats = weight_file.write(grown, "v3", delta=True)

    assert stats.full and "d.weight" in weight_file.layout
    assert torch.equal(read_back(weight_file)["d.weight"], torch.ones(3, 3))


def test_a_write_cut_short_leaves_nothing_known(tmp_path: Path) -> None:
    weight_file = WeightFile(tmp_path / "r.weights")
    weight_file.write(tensors(), "v1")
    failing = tensors(1)
    failing["c.weight"] = torch.empty(16, 16, dtype=torch.bfloat16, device="meta")  # no data

    with pytest.raises((NotImplementedError, RuntimeError)):
        weight_file.write(failing, "v2", delta=True)

    assert weight_file.version is None  # a mix of v1 and v2: the next write is whole
    assert weight_file.write(tensors(2), "v3", delta=True).full


def test_each_replica_gets_its_own_file(tmp_path: Path) -> None:
    assert file_for(tmp_path, "http://a:8000") != file_for(tmp_path, "http://b:8000")
    assert file_for(tmp_path, "http://a:8000/") == file_for(tmp_path, "http://a:8000")
