"""A learner subprocess on live traffic, and the figures its steps must show."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, select

from learner.proxy_process import ProxyServer
from learner.vllm_server import VLLMServer
from store.models import TrainingStep
from tests.support.traffic import traffic_until_step
from tests.support.waits import wait_for_line


def learner_command(
    vllm: VLLMServer, tiny_model: Path, db_url: str, checkpoints: Path, steps: int
) -> list[str]:
    """`onthejob learn` on the letter-'a' reward, one step per 32 graded calls."""
    return [
        *("learn", "--db", db_url, "--upstream", vllm.url, "--model", str(tiny_model)),
        *("--checkpoints", str(checkpoints), "--batch-trajectories", "32"),
        *("--grader", "python:learner.toys.letter:share_of_a_reward"),
        *("--learning-rate", "3e-3", "--max-steps", str(steps), "--poll-interval", "0.2"),
        *("--self-judge-shadow", "0"),  # no judge calls beside the measured steps
        "--truncated",
        "train",
    ]


def run_live(
    launch: list[str], vllm: VLLMServer, engine: Engine, proxy: ProxyServer, steps: int, log: Path
) -> list[dict[str, Any]]:
    """Run the learner command `launch` while one round of traffic per step goes through
    `proxy`; the recorded steps' metrics, in order. Each round after the first goes once the
    proxy routes to the last step's version, so that it is that version's own traffic."""
    with open(log, "wb") as out:
        learner = subprocess.Popen(launch, stdout=out, stderr=subprocess.STDOUT)
        try:
            # traffic from before the learner knows what serves (it may swap the base in
            # first) is from no verified version: not trainable
            wait_for_line(log, "learner ready", learner)
            for step in range(1, steps + 1):
                traffic_until_step(proxy.url + "/v1", vllm.model_name, engine, step, learner, log)
                wait_until_served(engine, step, proxy)
            learner.wait(timeout=120)
        finally:
            if learner.poll() is None:
                learner.kill()
                learner.wait()
    assert learner.returncode == 0, log.read_text()[-3000:]
    with engine.connect() as conn:
        rows = conn.execute(
            select(TrainingStep.step, TrainingStep.version, TrainingStep.metrics).order_by(
                TrainingStep.step
            )
        ).all()
    assert [r.step for r in rows] == list(range(1, steps + 1))
    assert all(r.version is not None for r in rows), "every step verified and served"
    assert httpx.get(vllm.url + "/weight_info").json()["weight_version"] == rows[-1].version
    return [dict(r.metrics, version=r.version) for r in rows]


def wait_until_served(engine: Engine, step: int, proxy: ProxyServer) -> None:
    """Poll (bounded) until every upstream of `proxy` serves the version of `step`, gate
    open: the step is recorded once verified, and the proxy learns of the swap just after."""
    with engine.connect() as conn:
        version = conn.execute(select(TrainingStep.version).where(TrainingStep.step == step))
        expected = version.scalar()
    assert expected is not None, f"step {step} was not published"
    proxy.wait_for(
        lambda health: all(
            u["policy_version"] == expected and not u["gated"] for u in health["upstreams"]
        ),
        f"the proxy routes to {expected}",
        timeout=60,
    )


def check_step_figures(steps: list[dict[str, Any]]) -> None:
    """Every step records its importance ratios and mismatch KL; the fresh ones (the calls
    the serving version made) are trainer-vs-vLLM numerics alone."""
    for number, metrics in enumerate(steps, 1):
        for key in ("ratio_mean", "ratio_min", "ratio_max", "mismatch_kl", "max_logprob_diff"):
            assert math.isfinite(metrics[key]), (number, key, metrics)
        assert metrics["ratio_min"] <= metrics["ratio_mean"] <= metrics["ratio_max"]
        print(
            f"step {number}: ratio {metrics['ratio_mean']:.5f} [{metrics['ratio_min']:.4f}, "
            f"{metrics['ratio_max']:.4f}], mismatch KL {metrics['mismatch_kl']:.2e}, fresh "
            f"{metrics.get('fresh_mismatch_kl', float('nan')):.2e} over "
            f"{metrics.get('fresh_tokens', 0)} of {metrics['trained_tokens']} tokens, probe "
            f"{metrics['max_logprob_diff']:.2e}, swap {metrics['swap_seconds']:.3f} s"
        )
    # after the first step, the traffic of a round is the serving version's own
    for metrics in steps[1:]:
        assert metrics["fresh_tokens"] > 0, metrics
        assert metrics["fresh_mismatch_kl"] < 1e-5, metrics
        assert 0.97 < metrics["fresh_ratio_min"] <= metrics["fresh_ratio_max"] < 1.03
