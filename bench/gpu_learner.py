"""A GRPO step on the models people serve, in one prepared run: Qwen2.5-0.5B (all weights)
and Qwen2.5-7B (a LoRA adapter), bf16, 8k-token sequences.

Built for a GPU machine with torch, transformers and peft and nothing to download (issue 13,
item 6): the models are random-init from Qwen2.5-0.5B- and Qwen2.5-7B-shaped transformers
configs, built on the device. For each, the learner's own `Trainer.step` (its logprob
processing in chunks, the clipped policy loss, gradient clipping, AdamW) is timed on a batch
of ``--samples`` sequences of ``--prompt-tokens`` + ``--completion-tokens`` random tokens,
against a bare forward+backward of the same micro-batches (bench/learner_step.py's
measurements, reused as they are): tokens/s, their ratio (target >= 0.8), the peak memory
of each, and the logprob computation's peak against one micro-batch's bf16 logits (target
<= 2x). The behaviour logprobs are the trainer's own, under the same precision, so the
first step is on-policy (ratio 1).

Precision: both train under ``--precision`` (the trainer's `TrainerConfig.precision`; this
bench's default ``bfloat16``, as the learner runs when vLLM serves bf16): the 0.5B model's full
weights as float32 masters with their AdamW state, the forward and backward passes on a bf16
copy; the 7B model's frozen base in bf16 alone, its adapter as float32 masters with a bf16
copy that computes (``float32``: the bf16 base as built, the float32 adapter as peft makes
it, no conversion).

A model that runs out of device memory without activation checkpointing is measured again
with it (and says so). ``--budget-s`` (default 450) skips what would start after it: the
whole run is meant to finish within 8 minutes on one H200 (about a minute of it building
the 7B model). Without CUDA, or with ``--small``, the same code runs on 2-layer, 256-wide
models with the real vocabularies and 512-token sequences: the CPU check of the script.

Run: python -m bench.gpu_learner [--small] [--models 0.5b,7b] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config
from transformers.utils import logging as transformers_logging

from bench.learner_step import BenchError, Memory, Timings, measure_memory, measure_steps
from learner.trainer import PRECISIONS, Trainer, TrainerConfig, micro_batches
from store.samples import Sample, Sampling

# The published configs' shapes (Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-7B config.json).
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "7b": {
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
}
# --small: the same families (head widths 64 and 128, grouped KV heads, tied or not, the
# real vocabularies, which dominate the logprob memory) at a size 2 CPU cores step in seconds
SMALL: dict[str, dict[str, Any]] = {
    "0.5b": {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "7b": {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
}
LORA = {"0.5b": False, "7b": True}  # the 7B model trains an adapter, as a team would


@dataclass
class Result:
    name: str
    params: int
    trainable: int
    activation_checkpointing: bool
    grpo: Timings
    bare: Timings
    first: dict[str, Any]
    memory: Memory
    device_peak: int | None  # CUDA: the whole measurement's peak allocation, weights included
    precision: str  # the trainer's
    build_s: float
    measure_s: float


def qwen2_config(name: str, small: bool) -> Qwen2Config:
    shape = {**SHAPES[name], **(SMALL[name] if small else {})}
    return Qwen2Config(
        **shape,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        hidden_act="silu",
        use_cache=False,
    )


def build_model(name: str, small: bool, device: str) -> torch.nn.Module:
    """Random-init on the device itself (a 7B model initialised on the CPU takes minutes):
    float32 full weights (the trainer's masters), or a bf16 base under a LoRA adapter."""
    lora = LORA[name]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            qwen2_config(name, small), dtype=torch.bfloat16 if lora else torch.float32
        )
    model.eval()
    if lora:
        from learner.lora import LoraSettings, wrap

        model = wrap(model, LoraSettings())  # the adapter in float32, peft's default
    return model


def trainer_precision(name: str, args: argparse.Namespace) -> str:
    # under "float32" the LoRA base stays bf16 as built and peft computes the float32
    # adapter as it comes (no conversion)
    return args.precision


@torch.no_grad()
def random_batch(
    trainer: Trainer, args: argparse.Namespace, vocab: int
) -> tuple[list[Sample], list[float]]:
    """Random tokens (sampling 8k tokens one at a time from a 7B model would take minutes),
    their behaviour logprobs from the trainer itself, in its precision (the first step is
    on-policy), random advantages."""
    rng = random.Random(args.seed)
    prompt, completion = args.prompt_tokens, args.completion_tokens
    samples = [
        Sample(
            trajectory_id=f"gpu-{i}",
            token_ids=[rng.randrange(vocab) for _ in range(prompt + completion)],
            loss_mask=[False] * prompt + [True] * completion,
            logprobs=[0.0] * (prompt + completion),
            sampling=Sampling(),
        )
        for i in range(args.samples)
    ]
    advantages = [rng.gauss(0.0, 1.0) for _ in samples]
    trainer.compute.eval()
    for batch in micro_batches(samples, advantages, args.micro_batch_tokens):
        tensors = trainer._tensors(batch)
        logprobs = trainer.token_logprobs(batch, tensors).float().cpu()
        for row, sample in enumerate(batch.samples):
            # token t's logprob comes from position t - 1; 0 where nothing is trained
            shifted = logprobs[row, : len(sample.token_ids) - 1].tolist()
            sample.logprobs = [0.0] + [
                lp if trained else 0.0
                for lp, trained in zip(shifted, sample.loss_mask[1:], strict=True)
            ]
    return samples, advantages


def measure(name: str, args: argparse.Namespace, checkpointing: bool) -> Result:
    device = args.device
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    model = build_model(name, args.small, device)
    config = TrainerConfig(
        learning_rate=1e-6,
        micro_batch_tokens=args.micro_batch_tokens,
        logprob_chunk_tokens=args.logprob_chunk_tokens,
        activation_checkpointing=checkpointing,
        precision=trainer_precision(name, args),
    )
    trainer = Trainer(model, config, device)
    if cuda:
        torch.cuda.synchronize()
    build_s = time.monotonic() - started
    started = time.monotonic()
    samples, advantages = random_batch(trainer, args, int(trainer.model.config.vocab_size))
    grpo, bare, first = measure_steps(trainer, samples, advantages, args)
    memory = measure_memory(trainer, samples, advantages, args.micro_batch_tokens)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return Result(
        name=name,
        params=sum(p.numel() for p in trainer.model.parameters()),
        trainable=sum(p.numel() for p in trainer.parameters),
        activation_checkpointing=checkpointing,
        grpo=grpo,
        bare=bare,
        first=first,
        memory=memory,
        device_peak=peak,
        precision=config.precision,
        build_s=build_s,
        measure_s=time.monotonic() - started,
    )


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def measure_fitting(name: str, args: argparse.Namespace) -> Result:
    """Without activation checkpointing if it fits in device memory, else with it."""
    if not args.activation_checkpointing:
        try:
            return measure(name, args, checkpointing=False)
        except torch.cuda.OutOfMemoryError as exc:
            reason = str(exc).splitlines()[0]
        # out of the except block: the traceback, and the tensors its frames held, are gone
        free(args.device)
        print(f"{name}: out of memory without activation checkpointing ({reason}); with it:")
    return measure(name, args, checkpointing=True)


def report(result: Result, args: argparse.Namespace) -> dict[str, Any]:
    tokens = args.samples * (args.prompt_tokens + args.completion_tokens)
    trained = args.samples * args.completion_tokens
    grpo_tps, bare_tps = tokens / result.grpo.p50, tokens / result.bare.p50
    gb = 1e9
    memory = result.memory
    print(
        f"\n{result.name}{' + LoRA' if LORA[result.name] else ''}: "
        f"{result.params / 1e6:,.1f} M params, {result.trainable / 1e6:,.2f} M trained; "
        f"trainer precision {result.precision}"
        f"{' (bf16 base, float32 adapter)' if LORA[result.name] else ''}; "
        f"activation checkpointing {'on' if result.activation_checkpointing else 'off'}; "
        f"built in {result.build_s:.1f} s, measured in {result.measure_s:.1f} s"
    )
    print(
        f"  on-policy check (first step): ratio_mean {result.first.get('ratio_mean', 0):.6f}, "
        f"mismatch_kl {result.first.get('mismatch_kl', 0):.2e}"
    )
    for label, timing, tps, peak in (
        ("GRPO step", result.grpo, grpo_tps, memory.grpo_step),
        ("bare fwd+bwd", result.bare, bare_tps, memory.bare),
    ):
        print(
            f"  {label:13} p50 {timing.p50:8.3f} s (min {timing.best:.3f})  "
            f"{tps:12,.0f} tokens/s  {trained / timing.p50:12,.0f} trained tokens/s  "
            f"step peak +{peak / gb:.2f} GB"
        )
    ratio = result.bare.p50 / result.grpo.p50
    print(f"  ratio GRPO/bare tokens/s {ratio:.3f} (target >= 0.8)")
    print(
        f"  logprobs of one micro-batch: peak {memory.logprobs / gb:.3f} GB = "
        f"{memory.logprobs / memory.bf16_logits:.2f}x its bf16 logits "
        f"({memory.bf16_logits / gb:.3f} GB; target <= 2); unchunked "
        f"{memory.logprobs_unchunked / memory.bf16_logits:.2f}x"
    )
    held = f"weights (with any bf16 copy) + AdamW state {memory.state / gb:.2f} GB"
    if result.device_peak is not None:
        print(f"  peak device memory {result.device_peak / gb:.2f} GB ({held})")
    else:
        print(f"  {held}; a step adds its peak above")
    return {
        "model": result.name,
        "lora": LORA[result.name],
        "params": result.params,
        "trainable_params": result.trainable,
        "activation_checkpointing": result.activation_checkpointing,
        "tokens_per_step": tokens,
        "trained_tokens_per_step": trained,
        "grpo_p50_s": result.grpo.p50,
        "bare_p50_s": result.bare.p50,
        "grpo_tokens_per_s": grpo_tps,
        "bare_tokens_per_s": bare_tps,
        "ratio_grpo_over_bare": ratio,
        "grpo_step_peak_bytes": memory.grpo_step,
        "bare_step_peak_bytes": memory.bare,
        "logprobs_peak_bytes": memory.logprobs,
        "logprobs_unchunked_peak_bytes": memory.logprobs_unchunked,
        "bf16_logits_bytes": memory.bf16_logits,
        "device_peak_bytes": result.device_peak,
        "state_bytes": memory.state,
        "precision": result.precision,
        "first_step": {k: result.first.get(k) for k in ("ratio_mean", "mismatch_kl")},
        "build_s": result.build_s,
        "measure_s": result.measure_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="0.5b,7b", help="comma-separated: 0.5b, 7b")
    parser.add_argument("--small", action="store_true", help="small shapes (default on CPU)")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="bfloat16",
        help="both models' trainer precision (default bfloat16)",
    )
    parser.add_argument("--samples", type=int, help="sequences per step (default 4; small 2)")
    parser.add_argument("--prompt-tokens", type=int, help="default 4096; small 256")
    parser.add_argument("--completion-tokens", type=int, help="default 4096; small 256")
    parser.add_argument("--micro-batch-tokens", type=int, help="default: one sequence")
    parser.add_argument(
        "--logprob-chunk-tokens", type=int, default=TrainerConfig.logprob_chunk_tokens
    )
    parser.add_argument("--activation-checkpointing", action="store_true", help="always on")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=450.0, help="start nothing after")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.small = args.small or not args.device.startswith("cuda")
    args.samples = args.samples or (2 if args.small else 4)
    args.prompt_tokens = args.prompt_tokens or (256 if args.small else 4096)
    args.completion_tokens = args.completion_tokens or (256 if args.small else 4096)
    args.micro_batch_tokens = args.micro_batch_tokens or (
        args.prompt_tokens + args.completion_tokens
    )
    names = [n.strip().lower() for n in args.models.split(",") if n.strip()]
    if unknown := sorted(set(names) - set(SHAPES)):
        parser.error(f"unknown models {unknown}; known: {sorted(SHAPES)}")
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    started = time.monotonic()
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(
        f"device {args.device} ({device_name}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; trainer precision {args.precision}; "
        f"{'small' if args.small else 'full'} shapes; {args.samples} x ({args.prompt_tokens} + "
        f"{args.completion_tokens}) tokens per step, micro-batches <= {args.micro_batch_tokens}",
        flush=True,
    )
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    failures = 0
    for name in names:
        if time.monotonic() - started > args.budget_s:
            print(f"\n{name}: skipped, the {args.budget_s:.0f} s budget is spent")
            results[name] = {"skipped": "budget"}
            continue
        try:
            results[name] = report(measure_fitting(name, args), args)
        except (BenchError, RuntimeError) as exc:  # one model's failure must not hide the other
            failures += 1
            print(f"\n{name}: failed: {type(exc).__name__}: {exc}")
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        free(args.device)
        if args.json:  # after each model: a run cut short still leaves what it measured
            args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
