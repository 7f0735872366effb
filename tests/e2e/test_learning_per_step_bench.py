"""bench/learning_per_step.py at its smallest setting on the tiny model: it runs, and reports
held-out gains over three seeds, at equal steps and at equal wall-clock (issue 42).

Against the session's vLLM (``--upstream``): the bench swaps its arms' weights into it and puts
the original weights back (``restore_vllm`` checks that it did). The in-process arms only:
with the learner arm (``bare,learner``, three seeds) the same run took 210 s here, each
seed's proxy and learner processes most of it; tests/e2e/test_learning_vllm.py runs the
learner on live traffic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SEEDS = (1, 2, 3)


def test_the_smallest_setting_reports_every_arm_on_heldout_prompts_over_three_seeds(
    vllm, tiny_model: Path, restore_vllm: str, tmp_path: Path
) -> None:
    result = tmp_path / "result.json"
    command = [
        *(sys.executable, "-m", "bench.learning_per_step"),
        *("--upstream", vllm.url, "--model", str(tiny_model)),
        *("--arms", "bare,trainer", "--steps", "2", "--seeds", ",".join(map(str, SEEDS))),
        *("--group", "2", "--heldout-samples", "2", "--heldout-points", "2"),
        *("--json", str(result)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    heldout = json.loads(result.read_text())["heldout"]
    assert heldout["seeds"] == list(SEEDS)
    rows = heldout["rows"]
    assert sorted((r["seed"], r["arm"]) for r in rows) == [
        (s, a) for s in SEEDS for a in ("[1] bare", "[2] trainer")
    ]
    for row in rows:
        assert row["steps"] == 2 and row["own_steps"] == 2
        assert 0 <= row["step_at_seconds"] <= 2
        assert 0.0 <= row["base"] <= 1.0
    for title in ("held-out gain at equal steps", "held-out gain at equal wall-clock"):
        at = lines.index(f"{title}, mean [95% interval]:")
        assert lines[at + 1].startswith("  [1] bare: ")
        assert lines[at + 1].endswith("(seeds 1, 2, 3)")
        assert lines[at + 2].startswith("  [2] trainer: ")
        assert "[1] bare" in lines[at + 2].split(";", 1)[1]
    assert "not a learning figure (issue 42)" not in done.stdout  # fresh seeds, three of them
