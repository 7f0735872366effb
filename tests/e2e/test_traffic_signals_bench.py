"""bench/traffic_signals.py at its smallest setting (issue 42): the tiny demo on seed 0, the
headline arm alone (``turn_credit``: the simulated user's traffic, graded by next-turn
signals only, trained with per-turn credit), a few held-out tasks before and after and one
learner step; it prints the arm's row, its gain, its share of the reference arm's gain
(none: no reference arm ran) and last the headline, and writes them to --json.

The demo it runs is seed 0's tiny demo, whose warm-up is the one tests/e2e/test_demo.py's
tiny demo, test_demo_seeds_bench.py and test_demo_rl_offline_bench.py use (the session's
demo cache, ``--model-cache``): none is built for this test when they have run. Seed 0
chose the demo's settings, and one seed makes no interval: the bench says so ("NOT a
learning figure"), as expected of a smoke run. The reference arm is the demo as it is
(test_demo.py's); the report over several arms and seeds, shares and headline included, is
tests/unit/bench/test_traffic_signals.py's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from learner.vllm_server import free_port
from tests.support.paths import ROOT

# the bench's own timeout (below) comes first, so that a slow machine fails with its
# output; a warm-up built here (no demo test ran before) takes 4 of those minutes on 2 cores
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
BENCH_TIMEOUT = 840

ARM = "turn_credit"
HELDOUT_TASKS = 8
NOTE = " -- seeds 0 chose settings: NOT a learning figure"


def test_the_smallest_setting_reports_its_arm_and_ends_with_the_headline(
    tmp_path: Path, demo_cache: Path
) -> None:
    result = tmp_path / "result.json"
    command = [
        *(sys.executable, "-m", "bench.traffic_signals", "--model", "tiny", "--seeds", "0"),
        *("--arms", ARM, "--steps", "1", "--minutes", "8", "--port", str(free_port())),
        *("--workdir", str(tmp_path / "work"), "--json", str(result)),
        *("--model-cache", str(demo_cache), "--train-tasks", "24"),
        *("--heldout-tasks", str(HELDOUT_TASKS), "--eval-samples", "1"),
        *("--tasks-per-round", "4", "--group-size", "8"),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=BENCH_TIMEOUT, cwd=ROOT
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or b""  # bytes, even with text=True
        said = out if isinstance(out, str) else out.decode(errors="replace")
        pytest.fail(f"the bench ran past {BENCH_TIMEOUT}s; it said:\n{said[-4000:]}")
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    data = json.loads(result.read_text())

    # the arm's row: seed 0, held-out success of 8 runs before and after, its one step
    [row] = data["arms"]
    assert (row["arm"], row["seed"], row["steps"]) == (ARM, 0, 1)
    for share in (row["before"], row["after"]):
        assert 0.0 <= share <= 1.0 and (share * HELDOUT_TASKS).is_integer()
    assert row["gain"] == pytest.approx(row["after"] - row["before"])
    assert 0 < row["minutes"] < 14
    assert lines[0] == "seeds (0, 1, 2) chose settings: what they measure is not a learning figure"

    # the report: the table, the gain, no share without a reference arm, the headline
    at = lines.index("arm                seed  before  after   gain  steps  minutes")
    assert re.fullmatch(rf"{ARM} +0 +\d+% +\d+% +[+-]\d+ +1 +\d+\.\d", lines[at + 1]), lines[at + 1]
    assert lines[at + 2] == "gain, points of held-out success:"
    assert re.fullmatch(
        rf"  {ARM} +[+-]\d+\.\d \(seed 0: no interval\){re.escape(NOTE)}", lines[at + 3]
    ), lines[at + 3]
    assert data["gains"][ARM]["seeds"] == [0]
    assert data["gains"][ARM]["mean"] == pytest.approx(100 * row["gain"])
    assert lines[at + 4] == "share of the reference arm's gain, percent (seeds where it gained):"
    assert lines[at + 5] == f"  {ARM:<18} none (left out: seeds 0)"
    assert data["shares"] == {ARM: None}
    assert lines[at + 6] == (
        "gain per minute of learning, points (equal wall-clock; the steps are equal):"
    )
    assert re.fullmatch(
        rf"  {ARM} +[+-]\d+\.\d\d \(seed 0: no interval\){re.escape(NOTE)}", lines[at + 7]
    ), lines[at + 7]
    assert 0 < row["learning_minutes"] < row["minutes"]
    assert lines[at + 8 :] == [
        f"next-turn signals ({ARM}): not measured (no {ARM} arm, or no reference gain){NOTE}"
    ]
