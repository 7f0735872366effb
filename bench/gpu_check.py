"""The prepared GPU check of issue 46 (item 4): three figures, one summary line each, on a
machine with torch (CUDA), transformers and peft, and no vLLM and no network: every model
is built from a config with random weights.

Run it from the repository root: ``sh bench/gpu_check.sh`` (its own python3, or
``PYTHON=...``; it passes its arguments on), or ``python -m bench.gpu_check [--json FILE]``.

  step      the learner's own `Trainer.step` (learner/trainer.py: chunked logprobs, the
            clipped policy loss, gradient clipping, AdamW) under bf16 precision (float32
            masters, a bf16 copy that computes) on a 0.5B-shaped model with SmolLM2's
            architecture (SmolLM2-135M-Instruct's LlamaConfig, widened from 576 to 1,152 and
            to 18 heads of 64 over 6 KV heads, its 30 layers kept: 0.48 B parameters), in
            tokens/s, against a bare forward+backward of the same micro-batches (plain
            cross-entropy, no optimizer); bench/learner_step.py's measurement, alternating
            rounds, medians.
  tenants   8 tenants' LoRA trainers on one base, built as `learn --tenants` builds them
            (learner/loop/weights.py): each a fresh rank-16 adapter on the bf16 base, the
            base's tensors shared by every live tenant (learner/shared_base.py), optimizer
            state per tenant; a tenant's step trains only its own adapter. Figures: tokens/s
            of a tenant's step with 8 tenants taking turns, against one adapter's step alone
            (and that step's bare forward+backward); the memory of 8 tenants after one step
            each against 1 tenant's (CUDA: allocated bytes; CPU: the tensors the trainers hold
            between steps, each counted once).
  transfer  the model's bf16 weights from a trainer process to a receiver process on the
            one GPU, bucketed (bench/gpu_transfer.py): a broadcast over NCCL, or, where NCCL
            refuses two ranks on one GPU, CUDA IPC (the line says which was measured and
            why), in GB/s, against the GPU's own device-to-device copy (`copy_`).

On a GPU a step is 8 sequences of 1,024 + 1,024 random tokens (their behaviour logprobs the
trainer's own, so each first step is on-policy) in micro-batches of 4,096 tokens; 1 warm-up
and 5 timed rounds of each figure; transfer buckets of 512 MiB. Each figure's own time ends
its line.

Time: at most 8 minutes in all on one H200. No part starts after ``--budget-s`` (420 s; the
line says it was skipped and why), the transfer's processes are killed at ``--limit-s``
(470 s), and gpu_check.sh kills the whole run at 475 s.

Without CUDA (or with ``--device cpu``) the same code runs its CPU half: a 2-layer, 192-wide
model with the same vocabulary, 2 sequences of 64 tokens, 2 timed rounds, one thread, gloo
for NCCL and shared memory for CUDA IPC. It finishes in well under a minute on 2 cores, and
every summary line says that no GPU is present and that its figures are CPU smoke figures,
not measurements. tests/e2e/test_gpu_check_bench.py runs it through gpu_check.sh.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as transformers_logging

from bench.gpu_learner import random_batch
from bench.gpu_transfer import Plan, buckets_of
from bench.learner_step import BenchError, Timings, measure_steps, settled, timed
from learner.lora import LoraSettings, wrap
from learner.shared_base import share_frozen
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

# SmolLM2-135M-Instruct's config.json (a LlamaForCausalLM), as `onthejob models prepare`
# ships it
SMOLLM2_135M: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
}
# widened to about 0.5B: its 30 layers, heads of 64 in groups of 3 per KV head, and its MLP
# ratio (8/3) kept
WIDE: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_attention_heads": 18,
    "num_key_value_heads": 6,
}
# the CPU half: the same architecture and vocabulary at a size 2 cores step in a second
SMALL: dict[str, Any] = {
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
}
NO_GPU = "no GPU: CPU smoke figures, not measurements"
FIGURES = ("step", "tenants", "transfer")


@dataclass
class Figure:
    name: str
    text: str
    values: dict[str, Any]
    seconds: float = 0.0  # the part's own, build included


def model_config(small: bool) -> LlamaConfig:
    return LlamaConfig(**{**SMOLLM2_135M, **(SMALL if small else WIDE)}, use_cache=False)


def build_model(config: LlamaConfig, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Random weights, initialised on the device itself (a CPU init of 0.5B takes long)."""
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def tokens_per_step(args: argparse.Namespace) -> int:
    return args.samples * (args.prompt_tokens + args.completion_tokens)


def trainer_config(args: argparse.Namespace, learning_rate: float) -> TrainerConfig:
    return TrainerConfig(
        learning_rate=learning_rate,
        micro_batch_tokens=args.micro_batch_tokens,
        precision="bfloat16",
    )


def seeded(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "seed": seed})


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# -- 1. the trainer's step ------------------------------------------------------------------


def step_figure(args: argparse.Namespace) -> Figure:
    config = model_config(args.small)
    model = build_model(config, args.device, torch.float32)  # the masters
    trainer = Trainer(model, trainer_config(args, 1e-6), args.device)
    params = sum(p.numel() for p in trainer.model.parameters())
    samples, advantages = random_batch(trainer, args, config.vocab_size)
    grpo, bare, _ = measure_steps(trainer, samples, advantages, args)
    tokens = tokens_per_step(args)
    step_tps, bare_tps = tokens / grpo.p50, tokens / bare.p50
    text = (
        f"Trainer.step (bf16, full weights) on a SmolLM2-shaped model of "
        f"{params / 1e6:,.1f} M parameters: "
        f"{step_tps:,.0f} tokens/s against a bare forward+backward's {bare_tps:,.0f} "
        f"({step_tps / bare_tps:.2f}x); {args.samples} x "
        f"{args.prompt_tokens + args.completion_tokens} tokens a step, p50 of {args.repeats}"
    )
    values = {
        "params": params,
        "tokens_per_step": tokens,
        "step_tokens_per_s": step_tps,
        "bare_tokens_per_s": bare_tps,
        "step_seconds": grpo.seconds,
        "bare_seconds": bare.seconds,
    }
    return Figure("step", text, values)


# -- 2. tenants' adapters on one base --------------------------------------------------------


def tenant_trainer(config: LlamaConfig, base_dir: Path, args: argparse.Namespace) -> Trainer:
    """A tenant's trainer as `learn --tenants` builds it: a fresh adapter on the bf16 base,
    the base's tensors shared with every live tenant's, bf16 precision."""
    model = wrap(build_model(config, args.device, torch.bfloat16), LoraSettings())
    share_frozen(model, base_dir)
    return Trainer(model, trainer_config(args, 1e-5), args.device)


def held_bytes(trainers: list[Trainer]) -> int:
    """What the trainers hold between steps (weights, their bf16 copies, AdamW state),
    each tensor counted once however many trainers hold it."""
    tensors: dict[int, torch.Tensor] = {}
    for trainer in trainers:
        for model in (trainer.model, trainer.compute):
            tensors.update({t.data_ptr(): t for t in model.parameters()})
        for state in trainer.optimizer.state.values():
            tensors.update({t.data_ptr(): t for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def memory(trainers: list[Trainer], device: str, before: int) -> int:
    if device.startswith("cuda"):
        free(device)
        return torch.cuda.memory_allocated() - before
    return held_bytes(trainers)


def tenants_figure(args: argparse.Namespace) -> Figure:
    config = model_config(args.small)
    before = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0
    with tempfile.TemporaryDirectory(prefix="gpu-check-base-") as base_dir:
        config.save_pretrained(base_dir)  # the base the tenants share, by its directory
        trainers = [tenant_trainer(config, Path(base_dir), args)]
        batches = [random_batch(trainers[0], args, config.vocab_size)]
        alone, alone_bare, _ = measure_steps(trainers[0], *batches[0], args)
        one = memory(trainers, args.device, before)
        for tenant in range(1, args.tenants):
            trainers.append(tenant_trainer(config, Path(base_dir), args))
            own = seeded(args, args.seed + tenant)  # each tenant its own traffic
            batches.append(random_batch(trainers[-1], own, config.vocab_size))
            trainers[-1].step(*batches[-1])  # each tenant has stepped once
        all_of_them = memory(trainers, args.device, before)
        turns = taking_turns(trainers, batches, args)
    tokens = tokens_per_step(args)
    turn_tps, alone_tps = tokens / turns.p50, tokens / alone.p50
    kind = "CUDA allocated" if args.device.startswith("cuda") else "held tensors"
    text = (
        f"{args.tenants} LoRA tenants on one base: {turn_tps:,.0f} tokens/s per tenant step "
        f"against {alone_tps:,.0f} for one adapter alone ({turn_tps / alone_tps:.2f}x; its "
        f"bare forward+backward {tokens / alone_bare.p50:,.0f}); memory of {args.tenants} "
        f"against 1: {all_of_them / one:.2f}x ({kind} {all_of_them / 1e9:.3f} GB vs "
        f"{one / 1e9:.3f} GB)"
    )
    values = {
        "tenants": args.tenants,
        "tenant_step_tokens_per_s": turn_tps,
        "alone_step_tokens_per_s": alone_tps,
        "alone_bare_tokens_per_s": tokens / alone_bare.p50,
        "memory_bytes": {"1": one, str(args.tenants): all_of_them, "kind": kind},
        "tenant_step_seconds": turns.seconds,
    }
    return Figure("tenants", text, values)


def taking_turns(
    trainers: list[Trainer],
    batches: list[tuple[list[Sample], list[float]]],
    args: argparse.Namespace,
) -> Timings:
    """Every tenant's step in turn, ``repeats`` times: each step follows another tenant's."""
    seconds = Timings()
    for _ in range(args.repeats):
        for trainer, (samples, advantages) in zip(trainers, batches, strict=True):
            step = settled(args.device, lambda t=trainer, s=samples, a=advantages: t.step(s, a))
            timed(step, seconds)
    return seconds


# -- 3. the weight transfer ------------------------------------------------------------------


def model_shapes(config: LlamaConfig) -> list[list[int]]:
    """The model's tensors (a tied one once), from a model built on no device."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return [list(p.shape) for p in model.parameters()]


def transfer_figure(args: argparse.Namespace, seconds_left: float) -> Figure:
    plan = Plan(
        shapes=model_shapes(model_config(args.small)),
        device="cuda" if args.device.startswith("cuda") else "cpu",
        bucket_bytes=args.bucket_mb * 2**20,
        warmup=args.warmup,
        repeats=args.repeats,
        way=args.transfer,
        timeout_s=max(10.0, min(120.0, seconds_left / 2 - 5)),
    )
    result = run_transfer(plan, seconds_left)
    if "error" in result:
        raise BenchError(result["error"])
    ways = {
        "nccl": "NCCL broadcast",
        "gloo": "gloo broadcast",
        "cuda-ipc": "CUDA IPC",
        "shared-memory": "shared memory",
    }
    why = f" ({result['refused']})" if result["refused"] else ""
    text = (
        f"{ways[result['way']]}{why}, trainer -> receiver process, {plan.nbytes / 1e9:.3f} GB "
        f"bf16 in {len(buckets_of(plan))} buckets ({args.bucket_mb} MiB, a larger tensor "
        f"alone): "
        f"{result['gbps']:,.2f} GB/s (p50 of {plan.repeats}) against the device's own copy "
        f"{result['copy_gbps']:,.2f} GB/s ({result['gbps'] / result['copy_gbps']:.2f}x)"
    )
    return Figure("transfer", text, result)


def run_transfer(plan: Plan, seconds_left: float) -> dict[str, Any]:
    """bench/gpu_transfer.py in a process group of its own, killed whole if it outlasts
    ``seconds_left``; its last line, a JSON object."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.gpu_transfer", "--plan", json.dumps(asdict(plan))],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=max(1.0, seconds_left))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise BenchError(f"the transfer outlasted the {seconds_left:.0f} s left") from None
    lines = out.strip().splitlines()
    for line in lines[:-1]:
        print(f"  transfer: {line}")
    if not lines:
        raise BenchError(f"the transfer printed nothing (exit status {process.returncode})")
    return dict(json.loads(lines[-1]))


# -- the run -------------------------------------------------------------------------------


def where(args: argparse.Namespace) -> str:
    if args.device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()}, {args.device}"
    if torch.cuda.is_available():
        return "CPU by --device cpu, a GPU present: CPU smoke figures, not measurements"
    return NO_GPU


def summary(figure: Figure, args: argparse.Namespace) -> str:
    return f"summary {figure.name} [{where(args)}]: {figure.text}; took {figure.seconds:.0f} s"


def run_figure(name: str, args: argparse.Namespace, started: float) -> Figure:
    elapsed = time.monotonic() - started
    if elapsed > args.budget_s:
        return Figure(
            name,
            f"skipped: {elapsed:.0f} s had passed, and no part starts after the "
            f"{args.budget_s:.0f} s budget",
            {"skipped": "budget"},
        )
    parts: dict[str, Callable[[], Figure]] = {
        "step": lambda: step_figure(args),
        "tenants": lambda: tenants_figure(args),
        "transfer": lambda: transfer_figure(args, args.limit_s - elapsed),
    }
    try:
        figure = parts[name]()
    except (BenchError, RuntimeError, OSError, ValueError) as exc:  # the others still run
        figure = Figure(name, f"failed: {type(exc).__name__}: {exc}", {"error": str(exc)})
    free(args.device)
    figure.seconds = time.monotonic() - started - elapsed
    return figure


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--figures", default=",".join(FIGURES), help="of: " + ", ".join(FIGURES))
    parser.add_argument("--device", help="default: cuda if available, else cpu (the CPU half)")
    parser.add_argument("--samples", type=int, help="sequences a step (8; CPU 2)")
    parser.add_argument("--prompt-tokens", type=int, help="1024; CPU 32")
    parser.add_argument("--completion-tokens", type=int, help="1024; CPU 32")
    parser.add_argument("--micro-batch-tokens", type=int, help="4096; CPU 128")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--repeats", type=int, help="timed rounds (5; CPU 2)")
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--bucket-mb", type=int, help="transfer bucket, MiB (512; CPU 4)")
    parser.add_argument("--transfer", choices=("auto", "collective", "ipc"), default="auto")
    parser.add_argument("--budget-s", type=float, default=420.0, help="no part starts after")
    parser.add_argument("--limit-s", type=float, default=470.0, help="the transfer ends by")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.small = not args.device.startswith("cuda")
    gpu_or_cpu = {
        "samples": (8, 2),
        "prompt_tokens": (1024, 32),
        "completion_tokens": (1024, 32),
        "micro_batch_tokens": (4096, 128),
        "repeats": (5, 2),
        "bucket_mb": (512, 4),
    }
    for key, (gpu, cpu) in gpu_or_cpu.items():
        if getattr(args, key) is None:
            setattr(args, key, cpu if args.small else gpu)
    args.figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    if unknown := sorted(set(args.figures) - set(FIGURES)):
        parser.error(f"unknown figures {unknown}; known: {', '.join(FIGURES)}")
    if args.tenants < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("--tenants and --repeats at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    if args.small:
        # smoke figures: one thread, since beside other work (CI runs tests side by side)
        # torch's spinning threads only slow it
        torch.set_num_threads(1)
    started = time.monotonic()
    print(
        f"gpu_check: {where(args)}; torch {torch.__version__}; "
        f"{'small' if args.small else '0.5B-shaped'} SmolLM2 model; {args.samples} x "
        f"({args.prompt_tokens} + {args.completion_tokens}) tokens a step; no part starts "
        f"after {args.budget_s:.0f} s",
        flush=True,
    )
    figures = []
    for name in args.figures:
        figures.append(run_figure(name, args, started))
        print(summary(figures[-1], args), flush=True)
        if args.json:  # after each figure: a run cut short keeps what it measured
            args.json.write_text(json.dumps([asdict(f) for f in figures], indent=2) + "\n")
    failed = [f.name for f in figures if "error" in f.values]
    print(f"gpu_check: {len(figures)} figures in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
