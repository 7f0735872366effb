"""Up to 8 tenants' adapters on one vLLM-CPU: verified publish time per adapter, and serving
throughput with the traffic spread over N adapters against all of it on one.

The model (``--model``, default the tiny one) is served by vLLM-CPU with LoRA on and
``--max-loras`` equal to the most tenants measured. Each tenant gets its own adapter
(random non-zero weights, so each answers differently), published the way the learner
publishes a tenant's version: loaded into the replica, its probe verified under its own
name against the trainer's logprobs (learner/swap/lora_publisher.py), no weight version
changed. Then, for N in ``--tenants`` (e.g. 1,2,4,8), ``--requests`` chat completions of
``--max-tokens`` tokens from ``--clients`` concurrent clients, spread round-robin over the
first N adapters; the base model alone is measured too. After a warm-up over every adapter,
the arms run ``--repeats`` times in turn and each keeps its median.

Prints a line per N: requests/s and tokens/s, and their ratio to one adapter; the publish
seconds (median, max). Last line: `8 adapters vs one: N.NNx throughput`.

Run: .venv/bin/python -m bench.tenant_serving [--tenants 1,2,4,8] [--requests 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from learner.checkpoint import load_model
from learner.lora import LoraSettings, save_adapter, wrap
from learner.swap.lora_publisher import LoraPublisher
from learner.swap.publisher import Probe, served_dtype, tolerance_for
from learner.tiny_model import build_tiny_model
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer

PROMPT = "Write something about the sea."


def make_adapter(base: Path, out: Path, rank: int, seed: int) -> Trainer:
    """An adapter with small random B (a fresh one answers like the base), saved to out."""
    torch.manual_seed(seed)
    model = wrap(load_model(base), LoraSettings(rank=rank, alpha=2.0 * rank))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.02)
    save_adapter(model, out, base_dir=base)
    return Trainer(model, TrainerConfig(), "cpu")


async def load(url: str, model: str, adapters: list[str], args: argparse.Namespace) -> float:
    """Requests per second with ``args.requests`` calls spread over ``adapters``."""
    limit = asyncio.Semaphore(args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:

        async def one(k: int) -> None:
            body = {
                "model": adapters[k % len(adapters)] if adapters else model,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": args.max_tokens,
                "ignore_eos": True,
                "temperature": 1.0,
            }
            async with limit:
                answer = await http.post("/v1/chat/completions", json=body)
                answer.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(args.requests)))
        return args.requests / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", default="1,2,4,8", help="adapter counts to measure")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm, in turn")
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    counts = sorted({int(n) for n in args.tenants.split(",") if n})
    if not counts or counts[0] < 1:
        parser.error("--tenants: adapter counts of at least 1")
    with tempfile.TemporaryDirectory(prefix="tenant-serving-") as tmp:
        work = Path(tmp)
        base = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        extra = ["--max-loras", str(counts[-1])]
        print(f"starting vLLM-CPU on {base} ...", flush=True)
        with VLLMServer(
            base, log_path=work / "vllm.log", max_lora_rank=args.rank, extra_args=extra
        ) as server:
            out = run(server, base, work, counts, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def run(
    server: VLLMServer, base: Path, work: Path, counts: list[int], args: argparse.Namespace
) -> dict[str, Any]:
    from transformers import AutoTokenizer

    probe = Probe(
        prompt_token_ids=list(AutoTokenizer.from_pretrained(str(base))(PROMPT)["input_ids"])
    )
    publisher = LoraPublisher(
        [server.url],
        probe=probe,
        tolerance=tolerance_for(served_dtype(server.url)),
        last_good=base,
        max_rank=args.rank,
        keep=counts[-1],
        label=lambda version, adapter: None,  # a tenant's: no weight version changes
    )
    names, seconds = [], []
    for k in range(counts[-1]):
        name = f"tenant-{k}-v1"
        trainer = make_adapter(base, work / name, args.rank, seed=k)
        result = publisher.publish(work / name, name, expected=trainer.logprobs_of)
        if not result.ok:
            raise SystemExit(f"publish of {name} failed: {result.error}")
        names.append(name)
        seconds.append(result.swap_seconds)
    print(
        f"publish, verified, per adapter: median {statistics.median(seconds):.3f}s, "
        f"max {max(seconds):.3f}s ({len(seconds)} adapters)"
    )
    # a warm-up over every adapter (first use compiles and caches), then each arm
    # ``--repeats`` times in turn, the median kept: the order of the arms weighs nothing
    asyncio.run(load(server.url, server.model_name, names, args))
    arms: dict[int, list[float]] = {0: [], **{n: [] for n in counts}}
    for _ in range(args.repeats):
        for n in arms:
            arms[n].append(asyncio.run(load(server.url, server.model_name, names[:n], args)))
    runs = {str(n): rates for n, rates in arms.items()}  # every run, for the spread
    base_rate = statistics.median(arms.pop(0))
    rates = {n: statistics.median(measured) for n, measured in arms.items()}
    tokens = args.max_tokens
    print(f"base model alone: {base_rate:6.1f} requests/s, {base_rate * tokens:7.0f} tokens/s")
    one = rates[counts[0]]
    for n, rate in rates.items():
        print(
            f"{n} adapter(s): {rate:6.1f} requests/s, {rate * tokens:7.0f} tokens/s, "
            f"{rate / one:.2f}x {counts[0]} adapter(s), {rate / base_rate:.2f}x the base"
        )
    most = counts[-1]
    print(f"{most} adapters vs {counts[0]}: {rates[most] / one:.2f}x throughput")
    return {
        "publish_seconds": seconds,
        "base_requests_per_s": base_rate,
        "requests_per_s": rates,
        "runs": runs,
        "settings": {k: str(v) for k, v in vars(args).items() if k != "json"},
    }


if __name__ == "__main__":
    sys.exit(main())
