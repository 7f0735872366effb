"""learner/swap/vllm_lora_base_rows.py on vLLM's own PyTorch LoRA ops: rows marked -1 (no
adapter) get no delta, rows with an adapter exactly what vLLM computes for them."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops

from learner.swap.vllm_lora_base_rows import without_base_rows

IN, RANK, OUT = 16, 4, 12
INDICES = torch.tensor([0, -1, 0, -1, -1])  # adapter rows and base rows, interleaved


@pytest.fixture
def weights() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(1, 1, RANK, IN, generator=generator)  # one slot: --max-loras 1
    b = torch.randn(1, 1, OUT, RANK, generator=generator)
    return a, b


def test_vllm_s_own_op_gives_base_rows_the_last_slot_s_delta(weights) -> None:
    """The bug, as shipped: the -1 rows are not left alone."""
    a, _ = weights
    x = torch.randn(len(INDICES), IN)
    shrunk = torch.zeros(len(INDICES), RANK)
    lora_ops.bgmv_shrink(x, a, shrunk, INDICES, 1.0)
    assert shrunk[INDICES < 0].abs().sum() > 0


def test_shrink_leaves_base_rows_without_a_delta(weights) -> None:
    a, _ = weights
    x = torch.randn(len(INDICES), IN)
    shrunk = torch.full((len(INDICES), RANK), 7.0)
    without_base_rows(lora_ops.bgmv_shrink)(x, a, shrunk, INDICES, 0.5)
    adapter = INDICES >= 0
    assert torch.equal(shrunk[~adapter], torch.zeros(int((~adapter).sum()), RANK))
    expected = torch.zeros(int(adapter.sum()), RANK)
    lora_ops.bgmv_shrink(x[adapter], a, expected, INDICES[adapter], 0.5)
    assert torch.equal(shrunk[adapter], expected)


@pytest.mark.parametrize("sliced", [False, True])
def test_expand_adds_nothing_to_base_rows(weights, sliced: bool) -> None:
    _, b = weights
    h = torch.randn(len(INDICES), RANK)
    y = torch.randn(len(INDICES), OUT + (4 if sliced else 0))
    before = y.clone()
    if sliced:
        without_base_rows(lora_ops.bgmv_expand_slice)(h, b, y, INDICES, 4, OUT, True)
    else:
        without_base_rows(lora_ops.bgmv_expand)(h, b, y, INDICES, True)
    adapter = INDICES >= 0
    assert torch.equal(y[~adapter], before[~adapter])
    expected = before[adapter].clone()
    if sliced:
        lora_ops.bgmv_expand_slice(h[adapter], b, expected, INDICES[adapter], 4, OUT, True)
    else:
        lora_ops.bgmv_expand(h[adapter], b, expected, INDICES[adapter], True)
    assert torch.equal(y[adapter], expected)
    assert not torch.equal(y[adapter], before[adapter])


def test_without_base_rows_the_op_is_called_as_it_was(weights) -> None:
    a, _ = weights
    x = torch.randn(3, IN)
    mine, theirs = torch.zeros(3, RANK), torch.zeros(3, RANK)
    indices = torch.zeros(3, dtype=torch.long)
    without_base_rows(lora_ops.bgmv_shrink)(x, a, mine, indices, 1.0)
    lora_ops.bgmv_shrink(x, a, theirs, indices, 1.0)
    assert torch.equal(mine, theirs)
