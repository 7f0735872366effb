"""Verify that a vLLM replica applies exactly a LoRA adapter's weights, in any dtype.

The replica answers checksums of the adapter's slot in each LoRA-wrapped layer, the tensors
its LoRA kernels multiply with (``onthejob_adapter_sums`` in learner/swap/vllm_weight_check.py);
the same sums are computed here from the adapter directory: A as loaded (cast to the dtype
vLLM holds it in), B cast and multiplied by the scaling vLLM folds into it (``alpha / r``, or
``alpha / sqrt(r)`` under rsLoRA), in that dtype as vLLM does. Both sides then sum identical
values, so, as for full weights (learner/swap/weight_check.py), they agree to float64 rounding
where a bf16 logprob probe differs by more than a training step changes it.

A module the adapter does not train must hold zeros in vLLM, and one it trains that vLLM
does not wrap is reported: vLLM would serve the adapter without it.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import cast

import httpx
import torch
from safetensors.torch import load_file

from learner.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from learner.swap.vllm_weight_check import (
    ADAPTER_METHOD,
    PROTOCOL,
    AdapterModuleSums,
    AdapterSums,
)
from learner.swap.weight_check import (
    SUM_TOLERANCE,
    WeightCheckUnavailable,
    WeightReport,
    ask_rpc,
    relative_offsets,
)

PREFIX = "base_model.model."


class AdapterReference:
    """The adapter side of one check: its tensors, scaling and a seed (every replica of a
    publish is compared with the same ones)."""

    def __init__(self, directory: Path, name: str, seed: int | None = None) -> None:
        self.name = name
        self.seed = random.randrange(2**31) if seed is None else seed
        config = json.loads((Path(directory) / ADAPTER_CONFIG).read_text())
        self.unsupported = [
            key for key in ("rank_pattern", "alpha_pattern") if config.get(key)
        ]  # per-module ranks or scalings: not reproduced here
        rank = int(config["r"])
        root = math.sqrt(rank) if config.get("use_rslora") else rank
        self.scaling = float(config.get("lora_alpha", rank)) / root
        tensors = load_file(str(Path(directory) / ADAPTER_WEIGHTS))
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        for key, tensor in tensors.items():
            module, _, kind = key.removeprefix(PREFIX).rpartition(".lora_")
            if kind == "A.weight":
                self.a[module] = tensor
            elif kind == "B.weight":
                self.b[module] = tensor

    def verify(self, client: httpx.Client, upstream: str) -> WeightReport:
        """Ask ``upstream`` for the adapter's checksums and compare them with ours."""
        if self.unsupported:
            raise WeightCheckUnavailable(
                f"adapters with {' or '.join(self.unsupported)} are not checked yet"
            )
        answer = cast(
            AdapterSums,
            ask_rpc(client, upstream, ADAPTER_METHOD, {"name": self.name, "seed": self.seed}),
        )
        if answer.get("protocol") != PROTOCOL:
            raise WeightCheckUnavailable(
                f"{upstream}: adapter check protocol {answer.get('protocol')!r}, the "
                f"learner's is {PROTOCOL}"
            )
        if "error" in answer:
            raise WeightCheckUnavailable(f"{upstream}: {answer['error']}")
        try:
            return self.compare(answer["modules"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise WeightCheckUnavailable(f"{upstream}: unreadable adapter check ({exc})") from exc

    def compare(self, modules: dict[str, AdapterModuleSums]) -> WeightReport:
        report = WeightReport()
        for module, entry in modules.items():
            if "other" in entry:  # not a linear layer (an embedding, the LM head)
                if module in self.a:
                    raise WeightCheckUnavailable(
                        f"the adapter trains {module}, a {entry['other']}: not checked yet"
                    )
                self._score(report, module, math.inf if entry["abs"] else 0.0, 1)
                continue
            dtype = getattr(torch, str(entry["dtype"]))
            report.dtype = str(entry["dtype"])
            served_a = torch.tensor(entry["a"], dtype=torch.float64)
            served_b = torch.tensor(entry["b"], dtype=torch.float64)
            a, b = self.a.get(module), self.b.get(module)
            if a is None or b is None:  # not trained: vLLM's slot must be zeros
                worst = float(torch.cat([served_a, served_b]).abs().sum())
                self._score(report, module, math.inf if worst > 0 else 0.0, len(served_a))
                continue
            b_held = b.to(dtype, copy=True)  # a copy: every replica is compared with b
            b_held *= self.scaling  # in vLLM's dtype, as it folds the scaling in
            rank = a.shape[0]
            if rank > len(served_a):
                self._score(report, f"{module} (rank {rank} > {len(served_a)})", math.inf, 0)
                continue
            worst = max(
                _offset(a.to(dtype), served_a, self.seed),
                _offset(b_held.T, served_b, self.seed),
            )
            self._score(report, module, worst, 2 * len(served_a))
        for module in sorted(set(self.a) - set(modules)):
            report.missing.append(f"{module} (trained, not served by vLLM)")
        return report

    @staticmethod
    def _score(report: WeightReport, name: str, worst: float, compared: int) -> None:
        report.compared += compared
        report.tensors += 1
        report.max_relative = max(report.max_relative, worst)
        if not worst <= SUM_TOLERANCE:  # NaN fails too
            report.mismatched.append(f"{name} ({worst:.2g} of its scale)")


def _offset(values: torch.Tensor, served: torch.Tensor, seed: int) -> float:
    """The largest relative offset over the rank rows (learner/swap/weight_check.py); the
    served rows beyond ``values``'s (rank padding) must be zero."""
    offsets = relative_offsets(values, served, seed).tolist()
    padding = served[values.shape[0] :].abs().tolist()
    worst = max([*offsets, *(math.inf if p else 0.0 for p in padding)], default=0.0)
    return math.inf if worst != worst else worst
