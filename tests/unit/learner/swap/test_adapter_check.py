"""The learner's side of the exact LoRA adapter check (learner/swap/adapter_check.py) against
answers laid out as vLLM's slots hold an adapter: A [rank, in] and B [out, rank] with the
scaling folded in, zero-padded to the replica's maximum rank. The replica's side runs in
tests/e2e/test_lora_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from learner.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from learner.swap.adapter_check import AdapterReference
from learner.swap.vllm_weight_check import weighted_sums
from learner.swap.weight_check import WeightCheckUnavailable

RANK, MAX_RANK, SEED = 4, 8, 11
MODULES = {"model.layers.0.self_attn.q_proj": (16, 12), "model.layers.0.mlp.down_proj": (12, 20)}


def adapter(directory: Path, *, alpha: float = 8.0, rslora: bool = False) -> dict:
    directory.mkdir()
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for module, (out, inp) in MODULES.items():
        key = f"base_model.model.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(RANK, inp, generator=generator)
        tensors[f"{key}.lora_B.weight"] = torch.randn(out, RANK, generator=generator)
    save_file(tensors, str(directory / ADAPTER_WEIGHTS))
    config = {"r": RANK, "lora_alpha": alpha, "use_rslora": rslora}
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config))
    return tensors


def served(tensors: dict, scaling: float, dtype: torch.dtype, extra: tuple[str, ...] = ()) -> dict:
    """What vLLM's slots hold, summed as its worker extension sums them."""
    modules = {}
    for module, (out, inp) in MODULES.items():
        key = f"base_model.model.{module}"
        a = torch.zeros(MAX_RANK, inp, dtype=dtype)
        b = torch.zeros(out, MAX_RANK, dtype=dtype)
        a[:RANK] = tensors[f"{key}.lora_A.weight"].to(dtype)
        scaled = tensors[f"{key}.lora_B.weight"].to(dtype)
        scaled *= scaling
        b[:, :RANK] = scaled
        modules[module] = {"a": a, "b": b}
    for module in extra:  # wrapped by vLLM, not trained: zeros
        modules[module] = {"a": torch.zeros(MAX_RANK, 6, dtype=dtype),
                           "b": torch.zeros(5, MAX_RANK, dtype=dtype)}  # fmt: skip
    return modules


def answer(modules: dict) -> dict:
    return {
        name: {
            "a": weighted_sums(t["a"], SEED),
            "b": weighted_sums(t["b"].T, SEED),
            "dtype": str(t["a"].dtype).removeprefix("torch."),
        }
        for name, t in modules.items()
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_adapter_as_vllm_holds_it_matches_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    tensors = adapter(tmp_path / "a", alpha=6.0)  # scaling 1.5: rounds in bf16
    reference = AdapterReference(tmp_path / "a", "v1", seed=SEED)
    replica = answer(served(tensors, 1.5, dtype, extra=("model.x.o_proj",)))
    for _ in range(2):  # every replica of a publish is compared with the same reference
        report = reference.compare(replica)
        assert report.ok, report.summary()
        assert report.tensors == 3 and report.max_relative < 1e-12


def test_rslora_scaling_is_reproduced(tmp_path: Path) -> None:
    tensors = adapter(tmp_path / "a", alpha=8.0, rslora=True)  # 8 / sqrt(4) = 4
    reference = AdapterReference(tmp_path / "a", "v1", seed=SEED)
    assert reference.compare(answer(served(tensors, 4.0, torch.bfloat16))).ok
    assert not reference.compare(answer(served(tensors, 2.0, torch.bfloat16))).ok  # alpha / r


def test_one_element_off_padding_or_an_untrained_slot_not_zero_fail(tmp_path: Path) -> None:
    tensors = adapter(tmp_path / "a")
    reference = AdapterReference(tmp_path / "a", "v1", seed=SEED)
    q, down = MODULES
    cases = {
        "one bf16 step": lambda m: m[q]["b"][3, 1].copy_(m[q]["b"][3, 1].float() * 1.01),
        "padding": lambda m: m[down]["a"][RANK + 1, 0].fill_(1e-3),
        "untrained slot": lambda m: m["model.x.o_proj"]["b"][0, 0].fill_(1e-3),
    }
    for case, corrupt in cases.items():
        modules = served(tensors, 2.0, torch.bfloat16, extra=("model.x.o_proj",))
        corrupt(modules)
        report = reference.compare(answer(modules))
        assert not report.ok and len(report.mismatched) == 1, (case, report.summary())


def test_a_trained_module_vllm_does_not_serve_is_reported(tmp_path: Path) -> None:
    tensors = adapter(tmp_path / "a")
    reference = AdapterReference(tmp_path / "a", "v1", seed=SEED)
    modules = served(tensors, 2.0, torch.float32)
    del modules["model.layers.0.mlp.down_proj"]
    report = reference.compare(answer(modules))
    assert not report.ok and report.missing == [
        "model.layers.0.mlp.down_proj (trained, not served by vLLM)"
    ]


def test_layers_laid_out_otherwise_must_be_empty_unless_trained(tmp_path: Path) -> None:
    """vLLM wraps the embedding and the LM head too; their slots are only said to be empty
    or not, and an adapter that trains one is not checked (the probe alone verifies it)."""
    tensors = adapter(tmp_path / "a")
    reference = AdapterReference(tmp_path / "a", "v1", seed=SEED)
    modules = answer(served(tensors, 2.0, torch.float32))
    empty = {"other": "VocabParallelEmbeddingWithLoRA", "abs": 0.0}
    assert reference.compare({**modules, "model.embed_tokens": empty}).ok
    used = {**empty, "abs": 0.5}
    assert not reference.compare({**modules, "model.embed_tokens": used}).ok
    trains = {**modules, "model.layers.0.mlp.down_proj": {**empty, "other": "Experts"}}
    with pytest.raises(WeightCheckUnavailable, match="not checked yet"):
        reference.compare(trains)
