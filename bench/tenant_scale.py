"""Many tenants on one machine (issue 46): the learner's memory and a tenant's step time with
N tenants' adapters on one base, and a tenant's new adapter published from memory against
from the disk, verified.

1. **The trainers**, a process for each N in ``--tenants`` (default 1,8,32), built as
   `learn --tenants` builds them: one bank of adapters on one frozen base
   (learner/adapter_bank.py), an AdapterTrainer a tenant, bf16 precision. After one step per
   tenant, the process's PSS (it is the only process holding them); then tenant 0's step
   time on one batch (``--steps`` steps, the median), as tokens/s.
2. **Publishing** (vLLM-CPU serving ``--model`` in ``--dtype``, with LoRA): ``--publishes``
   versions of one tenant's adapter published as the learner publishes them (LoraPublisher with the
   adapter's writer: its files written into /dev/shm, loaded from there, the checkpoint
   written beside; or written to the checkpoint directory, loaded from the disk), the two
   ways interleaved, each verified by its probe and exact check. Wall-clock of each publish,
   writing included: the median of each way.

Serving throughput with 8 adapters loaded against 1 is bench/tenant_serving.py's. Every arm
is printed; the last line reads
``tenants: 8 -> N.NNx memory of 1, 32 -> N.NNx; adapter publish N ms (disk N ms)``.

Run: .venv/bin/python -m bench.tenant_scale [--model smollm2-135m] [--tenants 1,8,32]
     [--publishes 10] [--tiny (a smoke run on the tiny model)]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROLLUP = Path("/proc/self/smaps_rollup")


def memory_mb(field: str) -> float:
    """This process's ``Pss`` or ``Rss`` MB now, from /proc/self/smaps_rollup."""
    for line in ROLLUP.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in {ROLLUP}")


def ratio(figures: dict[int, float], n: int) -> float | None:
    """``figures[n]`` against ``figures[1]`` (None where either was not measured)."""
    if n not in figures or 1 not in figures or not figures[1]:
        return None
    return figures[n] / figures[1]


def summary_line(memory: dict[int, float], publish_ms: dict[str, float]) -> str:
    """The bench's last line, from PSS MB by tenant count and median publish ms by way."""

    def times(n: int) -> str:
        value = ratio(memory, n)
        return "not measured" if value is None else f"{value:.2f}x"

    def ms(way: str) -> str:
        return f"{publish_ms[way]:.0f} ms" if way in publish_ms else "not measured"

    return (
        f"tenants: 8 -> {times(8)} memory of 1, 32 -> {times(32)}; "
        f"adapter publish {ms('memory')} (disk {ms('disk')})"
    )


def verdicts(
    memory: dict[int, float], tokens_per_s: dict[int, float], publish_ms: dict[str, float]
) -> list[str]:
    """Each figure against the issue's goal: 'PASS ...' or 'FAIL ...' lines."""
    goals = [
        ("memory, 8 tenants against 1", ratio(memory, 8), lambda r: r <= 1.3, "<= 1.30x"),
        ("memory, 32 tenants against 1", ratio(memory, 32), lambda r: r <= 2.0, "<= 2.00x"),
        ("step throughput, 8 against 1", ratio(tokens_per_s, 8), lambda r: r >= 0.9, ">= 0.90x"),
    ]
    lines = []
    for name, value, meets, goal in goals:
        if value is None:
            lines.append(f"FAIL {name}: not measured (goal {goal})")
        else:
            lines.append(f"{'PASS' if meets(value) else 'FAIL'} {name}: {value:.2f}x ({goal})")
    if "memory" in publish_ms:
        ok = publish_ms["memory"] <= 50
        lines.append(
            f"{'PASS' if ok else 'FAIL'} adapter publish from memory: "
            f"{publish_ms['memory']:.0f} ms median (<= 50 ms)"
        )
    else:
        lines.append("FAIL adapter publish from memory: not measured (<= 50 ms)")
    return lines


# ---- part 1: one process per tenant count


def trainers_child(base: Path, tenants: int, dtype_name: str, steps: int) -> dict[str, Any]:
    """Build ``tenants`` trainers on one bank, step each once; PSS, then tenant 0's steps."""
    import torch

    from bench.tenant_trainer_memory import trainer_for
    from learner.adapter_bank import AdapterBanks
    from store.samples import Sample

    torch.manual_seed(0)
    dtype, banks = getattr(torch, dtype_name), AdapterBanks()
    trainers, built = [], []
    batch: list[Sample] = []
    for n in range(tenants):
        started = time.monotonic()
        trainer = trainer_for("bank", base, dtype, banks, n)  # as `learn --tenants` builds it
        built.append(time.monotonic() - started)
        if not batch:
            batch = _batch(trainer, torch.Generator().manual_seed(0))
            advantages = [1.0, -1.0] * (len(batch) // 2)
        trainer.step(batch, advantages)
        trainers.append(trainer)
    gc.collect()
    pss, rss = memory_mb("Pss"), memory_mb("Rss")
    seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        trainers[0].step(batch, advantages)
        seconds.append(time.perf_counter() - started)
    tokens = sum(sum(sample.loss_mask) for sample in batch)
    return {"tenants": tenants, "pss_mb": pss, "rss_mb": rss, "step_seconds": seconds,
            "trained_tokens": tokens, "built_seconds": built}  # fmt: skip


def _batch(trainer: Any, generator: Any, samples: int = 8) -> list[Any]:
    """8 samples of 16 prompt and 48 sampled tokens, their logprobs the trainer's own."""
    import torch

    from store.samples import Sample

    vocab = int(trainer.served_model.config.vocab_size)
    batch = []
    for _ in range(samples):
        ids = torch.randint(0, vocab, (64,), generator=generator).tolist()
        prompt, completion = ids[:16], ids[16:]
        logprobs = trainer.logprobs_of(prompt, completion)
        batch.append(
            Sample(
                trajectory_id="t",
                token_ids=ids,
                loss_mask=[False] * 16 + [True] * 48,
                logprobs=[0.0] * 16 + list(logprobs),
            )
        )
    return batch


def measure_trainers(base: Path, counts: list[int], args: argparse.Namespace) -> list[dict]:
    rows = []
    for n in counts:
        command = [sys.executable, "-m", "bench.tenant_scale", "--child", str(n)]
        command += ["--model", str(base), "--dtype", args.dtype, "--steps", str(args.steps)]
        print(f"trainers: {n} tenant(s) in a process of their own ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the {n}-tenant process failed:\n{done.stderr[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        step = statistics.median(row["step_seconds"])
        row["tokens_per_s"] = row["trained_tokens"] / step
        print(
            f"  {n:>3} tenant(s): PSS {row['pss_mb']:.0f} MB (RSS {row['rss_mb']:.0f}); "
            f"tenant 0's step {step:.3f} s median of {len(row['step_seconds'])}, "
            f"{row['tokens_per_s']:.0f} trained tokens/s; a trainer built in "
            f"{min(row['built_seconds']):.2f}-{max(row['built_seconds']):.2f} s",
            flush=True,
        )
        rows.append(row)
    return rows


# ---- part 2: publishing, from memory and from the disk


def measure_publishes(base: Path, work: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    import torch
    from transformers import AutoTokenizer

    from bench.tenant_trainer_memory import SETTINGS, trainer_for
    from learner.adapter_bank import AdapterBanks
    from learner.lora import write_adapter
    from learner.swap.adapter_memory import adapter_memory, memory_root
    from learner.swap.lora_publisher import LoraPublisher
    from learner.swap.publisher import Probe, served_dtype, tolerance_for
    from learner.vllm_server import VLLMServer

    rank = SETTINGS.rank
    trainer = trainer_for("bank", base, getattr(torch, args.dtype), AdapterBanks(), 0)
    probe = Probe(list(AutoTokenizer.from_pretrained(str(base))("Tell me a story.")["input_ids"]))
    memory_dir = memory_root(work / "checkpoints")
    try:
        memory = adapter_memory("memory", work / "checkpoints")
    except ValueError as exc:  # no usable /dev/shm here: the disk alone is measured
        print(f"  from memory: not measured ({exc})", flush=True)
        memory = None
    seconds: dict[str, list[float]] = {"memory": [], "disk": []} if memory else {"disk": []}
    loading: dict[str, list[float]] = {way: [] for way in seconds}  # the replicas' load alone
    parts: dict[str, list[dict[str, float]]] = {way: [] for way in seconds}
    extra = ["--max-loras", "2", "--max-cpu-loras", "4"]
    print(f"publishing: vLLM-CPU on {base} with LoRA ...", flush=True)
    try:
        with VLLMServer(base, log_path=work / "vllm.log", max_lora_rank=rank,
                        extra_args=extra, dtype=args.dtype) as server:  # fmt: skip
            publishers = {
                way: LoraPublisher(
                    [server.url],
                    probe=probe,
                    tolerance=tolerance_for(served_dtype(server.url)),
                    last_good=base,
                    max_rank=rank,
                    keep=2,
                    label=lambda version, adapter: None,  # a tenant's: no weight version
                    memory=memory if way == "memory" else None,
                )
                for way in seconds
            }

            spent: dict[str, float] = {}  # this publish's seconds in each timed part

            def write(directory: Path) -> None:
                started = time.perf_counter()
                write_adapter(trainer.served_model, directory, base_dir=base)
                spent["write"] = time.perf_counter() - started

            def expected(prompt: list[int], completion: list[int]) -> list[float]:
                started = time.perf_counter()
                logprobs = trainer.logprobs_of(prompt, completion)
                spent["probe"] = time.perf_counter() - started
                return logprobs

            ways = list(seconds)
            for k in range(args.publishes + 1):  # the first round warms every way up
                for way in ways if k % 2 else ways[::-1]:
                    version = f"tenant0-{way}-{k}"
                    started = time.perf_counter()
                    spent.clear()
                    result = publishers[way].publish(
                        work / "checkpoints" / version, version,
                        expected=expected, write=write,
                    )  # fmt: skip
                    took = time.perf_counter() - started
                    if not result.ok:
                        raise SystemExit(f"publish {version} failed: {result.error}")
                    if k:
                        seconds[way].append(took)
                        loading[way].append(result.swap_seconds)
                        parts[way].append(dict(spent))
    finally:
        shutil.rmtree(memory_dir, ignore_errors=True)
    for way, measured in seconds.items():
        print(
            f"  from {way}: median {statistics.median(measured) * 1000:.0f} ms, "
            f"min {min(measured) * 1000:.0f}, max {max(measured) * 1000:.0f} "
            f"({len(measured)} publishes, verified); of it the replica's load "
            f"{statistics.median(loading[way]) * 1000:.0f} ms median",
            flush=True,
        )
        probe, written = (
            statistics.median(p.get(name, 0.0) for p in parts[way]) for name in ("probe", "write")
        )
        print(
            f"    of it (medians): the trainer's forward on the probe {probe * 1000:.0f} ms, "
            f"the adapter's files written {written * 1000:.0f} ms",
            flush=True,
        )
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="a models-list name or a dir")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model (smoke)")
    parser.add_argument("--tenants", default="1,8,32", help="tenant counts")
    parser.add_argument("--steps", type=int, default=5, help="tenant 0's timed steps")
    parser.add_argument("--publishes", type=int, default=10, help="of each way, after a pair")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    counts = sorted({int(n) for n in args.tenants.split(",") if n.strip()})
    if not counts or counts[0] < 1 or args.steps < 1 or args.publishes < 1:
        parser.error("--tenants: counts of at least 1; --steps and --publishes at least 1")
    if args.child is not None:
        print(json.dumps(trainers_child(Path(args.model), args.child, args.dtype, args.steps)))
        return 0
    with tempfile.TemporaryDirectory(prefix="tenant-scale-") as tmp:
        work = Path(tmp)
        if args.tiny:
            from learner.tiny_model import build_tiny_model

            base = build_tiny_model(work / "tiny", seed=0).resolve()
        else:
            from learner.real_models import prepared_or_path

            base = prepared_or_path(args.model)
        rows = measure_trainers(base, counts, args)
        publishes = measure_publishes(base, work, args)
    memory = {row["tenants"]: row["pss_mb"] for row in rows}
    throughput = {row["tenants"]: row["tokens_per_s"] for row in rows}
    publish_ms = {way: statistics.median(s) * 1000 for way, s in publishes.items()}
    for line in verdicts(memory, throughput, publish_ms):
        print(line)
    if args.json:
        record = {"trainers": rows, "publish_seconds": publishes, "settings": vars(args)}
        args.json.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(summary_line(memory, publish_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
