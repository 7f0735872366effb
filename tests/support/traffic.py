"""Live traffic through the proxy and waiting for the learner's steps."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import openai
from sqlalchemy import func, select

from learner.toys.letter import share_of_a
from store.models import TrainingStep

PROMPTS = [f"Write something, take {i}." for i in range(4)]


async def traffic(
    base_url: str, model: str, rounds: int, group: int = 8, api_key: str = "x"
) -> list[float]:
    """`rounds` x len(PROMPTS) x `group` single-call episodes (with `api_key`); their
    rewards by the share of 'a'."""
    limit = asyncio.Semaphore(16)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as api:

        async def one(prompt: str) -> float:
            async with limit:
                reply = await api.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=8,
                    temperature=1.0,
                )
            return share_of_a(reply.choices[0].message.content or "")

        return await asyncio.gather(
            *(one(p) for _ in range(rounds) for p in PROMPTS for _ in range(group))
        )


def wait_for_step(
    engine, step: int, learner: subprocess.Popen, log: Path, timeout: float = 180
) -> None:
    """Poll (bounded) until the learner has recorded `step`."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            done = conn.execute(select(func.max(TrainingStep.step))).scalar() or 0
        if done >= step:
            return
        assert learner.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"step {step} never came: {log.read_text()[-2000:]}"
        time.sleep(0.2)


def traffic_until_step(
    base_url: str,
    model: str,
    engine,
    step: int,
    learner: subprocess.Popen,
    log: Path,
    *,
    settle: float = 30.0,
    most_rounds: int = 4,
    api_key: str = "x",
) -> list[float]:
    """A round of traffic, then another while the learner has not recorded `step` within
    `settle` seconds (at most `most_rounds`): a round is exactly one batch, and a reply whose
    reward equals its group's mean carries no signal, so one round is sometimes a few
    trajectories short. The rewards of every round sent."""
    rewards: list[float] = []
    for _ in range(most_rounds):
        rewards += asyncio.run(traffic(base_url, model, rounds=1, api_key=api_key))
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if (conn.execute(select(func.max(TrainingStep.step))).scalar() or 0) >= step:
                    return rewards
            assert learner.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
    raise AssertionError(f"step {step} never came: {log.read_text()[-2000:]}")
