"""The tenants' trainers' memory, three ways: each trainer a model with its own copy of the
base ("apart"); each a model of its own whose frozen tensors point at one copy
(learner/shared_base.py: "shared", what `learn --tenants` did before issue 46); and every
tenant's adapter a slot of one model on one base (learner/adapter_bank.py: "bank", what it
does now).

Each arm runs in a process of its own: it builds the most of ``--tenants`` LoRA trainers on
``--model`` (a name of `onthejob models list`, default smollm2-135m, or a directory) as the
learner builds a tenant's (the base in ``--dtype``, a fresh adapter, bf16 precision: float32
masters of the adapter with a bf16 copy), takes one step on each, and reports after each
trainer its resident memory and the bytes of the tensors the trainers hold (weights,
masters, copies, buffers, optimizer state; each storage once). The last line reads
``tenants: 8 -> N.NNx memory of 1 (bank), N.NNx (shared), N.NNx (apart); tensors ...``.

Run: .venv/bin/python -m bench.tenant_trainer_memory [--tenants 1,2,8] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from learner.adapter_bank import AdapterBanks
from learner.adapter_trainer import AdapterTrainer
from learner.checkpoint import load_model
from learner.lora import LoraSettings, wrap
from learner.real_models import prepared_or_path
from learner.shared_base import share_frozen
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

PROMPT, COMPLETION = [1, 10, 20, 30], [40, 50, 60]


def resident_mb(field: str = "VmRSS") -> float:
    """This process's resident MB now (VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


ARMS = ("apart", "shared", "bank")
SETTINGS = LoraSettings(rank=8, alpha=16)
CONFIG = TrainerConfig(precision="bfloat16", learning_rate=1e-4)


def held_mb(trainers: list[Trainer]) -> float:
    """MB of the tensors the trainers hold, each storage counted once."""
    storages: dict[int, int] = {}
    for trainer in trainers:
        tensors = [*trainer.model.parameters(), *trainer.compute.parameters()]
        tensors += [*trainer.model.buffers(), *trainer.compute.buffers()]
        for state in trainer.optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        for tensor in tensors:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values()) / 2**20


def trainer_for(arm: str, base: Path, dtype: torch.dtype, banks: AdapterBanks, n: int) -> Trainer:
    if arm == "bank":
        bank, slot = banks.take(f"tenant{n}", base, SETTINGS, dtype, "cpu")
        return AdapterTrainer(bank, slot, CONFIG, "cpu")
    model = wrap(load_model(base, dtype), SETTINGS)
    if arm == "shared":
        share_frozen(model, base)
    return Trainer(model, CONFIG, "cpu")


def one_arm(base: Path, tenants: int, dtype: torch.dtype, arm: str) -> list[list[float]]:
    """[resident MB, tensor MB, peak resident MB, seconds to build it] after each trainer
    (and its first step)."""
    trainers: list[Trainer] = []
    banks = AdapterBanks()
    after: list[list[float]] = []
    for n in range(tenants):
        started = time.monotonic()
        trainer = trainer_for(arm, base, dtype, banks, n)
        built = time.monotonic() - started
        logprobs = trainer.logprobs_of(PROMPT, COMPLETION)
        sample = Sample(
            trajectory_id="t",
            token_ids=PROMPT + COMPLETION,
            loss_mask=[False] * len(PROMPT) + [True] * len(COMPLETION),
            logprobs=[0.0] * len(PROMPT) + logprobs,
        )
        trainer.step([sample], [1.0])
        trainers.append(trainer)
        gc.collect()
        after.append([resident_mb(), held_mb(trainers), resident_mb("VmHWM"), built])
    return after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tenants", default="1,2,8", help="tenant counts to report")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    base = prepared_or_path(args.model)
    counts = sorted({int(n) for n in args.tenants.split(",")})
    if args.arm:
        dtype = getattr(torch, args.dtype)
        print(json.dumps(one_arm(base, max(counts), dtype, args.arm)))
        return
    ratios: dict[str, tuple[float, float]] = {}
    for arm in args.arms.split(","):
        command = [sys.executable, "-m", "bench.tenant_trainer_memory", "--model", str(base)]
        command += ["--tenants", str(max(counts)), "--dtype", args.dtype, "--arm", arm]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        after = json.loads(out.stdout.strip().splitlines()[-1])
        for n in counts:
            resident, held, peak, built = after[n - 1]
            print(
                f"{arm:>6}: {n} tenants: resident {resident:.0f} MB (peak {peak:.0f}), "
                f"tensors {held:.1f} MB; the last trainer built in {built:.2f} s"
            )
        last = after[max(counts) - 1]
        ratios[arm] = (last[0] / after[0][0], last[1] / after[0][1])
    top = max(counts)
    memory = ", ".join(f"{r[0]:.2f}x ({arm})" for arm, r in ratios.items())
    tensors = ", ".join(f"{r[1]:.2f}x ({arm})" for arm, r in ratios.items())
    print(f"tenants: {top} -> {memory} memory of 1; tensors {tensors}")


if __name__ == "__main__":
    main()
