"""The exact weight check's two halves against each other, on a model laid out like vLLM's:
fused projections whose weight is repacked away (as vLLM-CPU does), a vocabulary padded
beyond the checkpoint's, an LM head tied to the embedding. The real replica is tested in
tests/e2e/test_bf16_vllm.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from learner.swap.vllm_weight_check import weight_sums
from learner.swap.weight_check import SUM_TOLERANCE, DictTensors, compare

HIDDEN, VOCAB, PADDED = 16, 50, 64
DTYPE = torch.bfloat16


class UnquantizedLinearMethod:
    """A quant_method whose apply multiplies by a packed copy, like vLLM-CPU's GEMMs."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Any = None) -> torch.Tensor:
        return (x.float() @ layer.packed.float()).to(x.dtype)


class Repacked(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0, dtype=DTYPE), requires_grad=False)
        self.packed = weight.t().contiguous()  # [in, out]: not a parameter, as on vLLM-CPU
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.input_size_per_partition = weight.shape[1]
        self.quant_method = UnquantizedLinearMethod()


class Embedding(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        padded = torch.zeros(PADDED, HIDDEN, dtype=DTYPE)
        padded[:VOCAB] = weight
        self.weight = torch.nn.Parameter(padded, requires_grad=False)
        self.embedding_dim = HIDDEN
        self.org_vocab_size = VOCAB
        self.quant_method = UnquantizedEmbeddingMethod()


class UnquantizedEmbeddingMethod:
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: Any = None) -> torch.Tensor:
        return (x.float() @ layer.weight.float().t()).to(x.dtype)


class Head(torch.nn.Module):
    """vLLM-CPU's tied LM head: its own module holding the embedding's weight, and a copy
    packed for its GEMM (what goes stale if a reload misses it)."""

    def __init__(self, embedding: Embedding) -> None:
        super().__init__()
        self.weight = embedding.weight
        self.packed = embedding.weight.detach().t().contiguous().clone()
        self.embedding_dim = HIDDEN
        self.org_vocab_size = VOCAB
        self.quant_method = UnquantizedLinearMethod()


def checkpoint() -> dict[str, torch.Tensor]:
    """The tensors as a checkpoint holds them: float32, not rounded to bf16."""
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": (4, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": (4, HIDDEN),
        "model.layers.0.self_attn.q_proj.bias": (HIDDEN,),
        "model.layers.0.self_attn.k_proj.bias": (4,),
        "model.layers.0.self_attn.v_proj.bias": (4,),
        "model.norm.weight": (HIDDEN,),
    }
    return {name: torch.randn(*shape, generator=g) * 0.02 for name, shape in shapes.items()}


def served(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """What vLLM builds from ``tensors`` in bf16: fused, repacked, padded, tied."""
    half = {k: v.to(DTYPE) for k, v in tensors.items()}
    attn = "model.layers.0.self_attn"
    parts = [f"{attn}.{p}_proj" for p in "qkv"]
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = Embedding(half["model.embed_tokens.weight"])
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    layer.self_attn.qkv_proj = Repacked(
        torch.cat([half[f"{p}.weight"] for p in parts]),
        torch.cat([half[f"{p}.bias"] for p in parts]),
    )
    model.model.layers = torch.nn.ModuleList([layer])
    model.model.norm = torch.nn.Module()
    model.model.norm.weight = torch.nn.Parameter(half["model.norm.weight"], requires_grad=False)
    model.lm_head = Head(model.model.embed_tokens)
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    return model


def answer(model: torch.nn.Module, seed: int) -> dict[str, Any]:
    sums = weight_sums(model, seed, columns=4)
    return {**sums, "dtype": "bfloat16"}


def test_the_served_weights_match_the_checkpoint_exactly() -> None:
    tensors = checkpoint()
    report = compare(answer(served(tensors), 7), DictTensors(tensors), 7)
    assert report.ok, report.summary()
    assert report.max_relative <= SUM_TOLERANCE
    # the fused projection and the padded, tied embedding as kernels; bias, norm and
    # embedding rows as parameters
    assert report.tensors == 6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_bf16_unit_in_one_repacked_weight_is_named(seed: int) -> None:
    tensors = checkpoint()
    model = served(tensors)
    qkv = model.model.layers[0].self_attn.qkv_proj
    sums = answer(model, seed)
    column = sums["kernels"]["model.layers.0.self_attn.qkv_proj"]["columns"][0]
    # the next bf16 value: one unit in the last place
    qkv.packed[column, 3] = (qkv.packed[column, 3].view(torch.int16) + 1).view(DTYPE)
    report = compare(answer(model, seed), DictTensors(tensors), seed)
    assert [m.split(" ")[0] for m in report.mismatched] == ["model.layers.0.self_attn.qkv_proj"]


def test_a_stale_tied_head_is_told_from_the_embedding() -> None:
    tensors = checkpoint()
    model = served(tensors)
    model.lm_head.packed += 0.01
    report = compare(answer(model, 3), DictTensors(tensors), 3)
    assert [m.split(" ")[0] for m in report.mismatched] == ["lm_head"]


def test_a_tensor_the_checkpoint_lacks_is_reported_missing() -> None:
    tensors = checkpoint()
    sums = answer(served(tensors), 5)
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    report = compare(sums, DictTensors(tensors), 5)
    assert not report.ok
    assert report.missing == ["model.layers.0.self_attn.qkv_proj"]


def test_nan_weights_fail() -> None:
    tensors = checkpoint()
    model = served(tensors)
    model.model.norm.weight.data[0] = float("nan")
    report = compare(answer(model, 1), DictTensors(tensors), 1)
    assert [m.split(" ")[0] for m in report.mismatched] == ["model.norm.weight"]


class Fp8LinearMethod(UnquantizedLinearMethod):
    """A quantized method: its one-hot answer is not the checkpoint's column."""


def test_a_quantized_kernel_makes_the_check_unavailable_not_a_mismatch() -> None:
    tensors = checkpoint()
    model = served(tensors)
    model.model.layers[0].self_attn.qkv_proj.quant_method = Fp8LinearMethod()
    report = compare(answer(model, 4), DictTensors(tensors), 4)
    assert not report.mappable and not report.ok
    assert report.unsupported == ["model.layers.0.self_attn.qkv_proj"]
    assert report.mismatched == []


def test_the_replica_side_imports_only_torch_outside_a_vllm_worker() -> None:
    """It runs in vLLM's own image too; in the learner it must not pull vLLM in (it registers
    our plugin only inside a vLLM worker)."""
    import subprocess
    import sys

    code = "import sys, learner.swap.vllm_weight_check; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("rounded_first", [True, False])
def test_a_parameter_kept_wider_than_the_model_matches_rounded_or_not(rounded_first: bool) -> None:
    """vLLM may keep a parameter in float32 in a bf16 model (a GEMM's bias): loaded either
    from the bf16-rounded value or from the checkpoint's own; both are the checkpoint's."""
    tensors = checkpoint()
    model = served(tensors)
    norm = tensors["model.norm.weight"]
    kept = norm.to(DTYPE).float() if rounded_first else norm.clone()
    model.model.norm.weight = torch.nn.Parameter(kept, requires_grad=False)
    report = compare(answer(model, 5), DictTensors(tensors), 5)
    assert report.ok, report.summary()
    model.model.norm.weight.data[0] += 1e-3  # off by less than a bf16 unit: still found
    report = compare(answer(model, 5), DictTensors(tensors), 5)
    assert [m.split(" ")[0] for m in report.mismatched] == ["model.norm.weight"]
