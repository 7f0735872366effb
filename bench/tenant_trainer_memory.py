"""The tenants' trainers' memory: each one holding its own copy of the base, against one
base shared by all (learner/shared_base.py, what `learn --tenants` does).

Each arm runs in a process of its own: it builds ``--tenants`` LoRA trainers on ``--model``
(a name of `onthejob models list`, default smollm2-135m, or a directory) as the learner
builds a tenant's (the base in ``--dtype``, a fresh adapter, bf16 precision: float32
masters of the adapter with a bf16 copy), takes one step on each, and reports its resident
memory after each trainer. The last line reads
``tenant trainers' memory beyond the first, apart vs shared: N.Nx``.

Run: .venv/bin/python -m bench.tenant_trainer_memory [--tenants 4] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import torch

from learner.checkpoint import load_model
from learner.lora import LoraSettings, wrap
from learner.real_models import prepared_or_path
from learner.shared_base import share_frozen
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

PROMPT, COMPLETION = [1, 10, 20, 30], [40, 50, 60]


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def one_arm(base: Path, tenants: int, dtype: torch.dtype, shared: bool) -> list[float]:
    """Resident MB after each trainer (and its first step)."""
    trainers: list[Trainer] = []
    after: list[float] = []
    for _ in range(tenants):
        model = wrap(load_model(base, dtype), LoraSettings(rank=8, alpha=16))
        if shared:
            share_frozen(model, base)
        trainer = Trainer(model, TrainerConfig(precision="bfloat16", learning_rate=1e-4), "cpu")
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
        after.append(resident_mb())
    return after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--arm", choices=["apart", "shared"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    base = prepared_or_path(args.model)
    if args.arm:
        dtype = getattr(torch, args.dtype)
        print(json.dumps(one_arm(base, args.tenants, dtype, args.arm == "shared")))
        return
    common = ["--tenants", str(args.tenants), "--dtype", args.dtype]
    beyond: dict[str, float] = {}
    for arm in ("apart", "shared"):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.tenant_trainer_memory",
                "--model",
                str(base),
                *common,
                "--arm",
                arm,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        after = json.loads(out.stdout.strip().splitlines()[-1])
        beyond[arm] = after[-1] - after[0]
        steps = ", ".join(f"{mb:.0f}" for mb in after)
        print(f"{arm:>6}: resident MB after each of {args.tenants} trainers: {steps}")
        print(f"{arm:>6}: each trainer beyond the first: {beyond[arm] / (args.tenants - 1):.0f} MB")
    ratio = beyond["apart"] / max(beyond["shared"], 1.0)
    print(f"tenant trainers' memory beyond the first, apart vs shared: {ratio:.1f}x")


if __name__ == "__main__":
    main()
