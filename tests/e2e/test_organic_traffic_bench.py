"""bench/organic_traffic.py at its smallest setting on the tiny model (issue 42): two arms
(``off``, the reference, and ``version``, the learner's default type baseline), one seed, a
few dozen unique calls and two learner steps; it prints every arm's row, the reward windows,
the held-out gains against the first arm, and writes them to --json.

Against the session's vLLM (``--upstream``): each arm's learner swaps its versions into it,
and the bench serves its checkpoints again to measure them; ``restore_vllm`` checks that the
original weights are back. One seed makes no interval: each gain says "(seed 3: no
interval)", as expected of a smoke run (not a learning figure); the bench's own runs use
three fresh seeds.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from learner.vllm_server import VLLMServer
from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ARMS = ("off", "version")
SEED = 3
STEPS = 2
CALLS = 32


def test_the_smallest_setting_reports_every_arm_and_its_heldout_gain_against_the_first(
    vllm: VLLMServer, tiny_model: Path, restore_vllm: str, tmp_path: Path
) -> None:
    result = tmp_path / "result.json"
    command = [
        *(sys.executable, "-m", "bench.organic_traffic"),
        *("--upstream", vllm.url, "--model", str(tiny_model)),
        *("--arms", ",".join(ARMS), "--seeds", str(SEED), "--calls", str(CALLS)),
        *("--steps", str(STEPS), "--batch-trajectories", "8", "--clients", "2"),
        *("--group", "1", "--window", "8", "--heldout-samples", "2", "--heldout-points", "2"),
        *("--json", str(result)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420, cwd=ROOT)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    data = json.loads(result.read_text())

    # every arm's row on the held-out prompts, its steps within what it was allowed
    heldout = data["heldout"]
    assert heldout["seeds"] == [SEED]
    rows = {row["arm"]: row for row in heldout["rows"]}
    assert list(rows) == list(ARMS) and all(row["seed"] == SEED for row in rows.values())
    for row in rows.values():
        assert 0 <= row["steps"] <= row["own_steps"] <= STEPS
        assert 0.0 <= row["base"] <= 1.0 and 0.0 <= row["at_steps"] <= 1.0
        assert -1.0 <= row["gain_steps"] <= 1.0 and -1.0 <= row["gain_seconds"] <= 1.0
        assert 0 <= row["step_at_seconds"] <= row["own_steps"] and row["own_seconds"] > 0
    # the same starting weights measured once, for both arms
    assert rows["off"]["base"] == rows["version"]["base"]
    # the version arm has a baseline for a prompt seen once: it trains
    assert rows["version"]["own_steps"] >= 1

    # the reward windows of the traffic's own prompts, per arm
    windows = data["by_seed"][str(SEED)]["windows"]
    assert list(windows) == list(ARMS)
    for arm in ARMS:
        assert windows[arm]["windows"] and all(0 <= w <= 1 for w in windows[arm]["windows"])
        assert re.search(rf"^ *{arm}: \d+ steps, \d+ samples trained", done.stdout, re.M), arm

    # the summary: each arm's mean gain, the second against the first
    for title in ("held-out gain at equal steps", "held-out gain at equal wall-clock"):
        at = lines.index(f"{title}, mean [95% interval]:")
        assert re.fullmatch(r"  off: [+-]\d\.\d{3} \(seed 3: no interval\)", lines[at + 1])
        assert re.fullmatch(
            r"  version: [+-]\d\.\d{3} \(seed 3: no interval\); "
            r"(\d+\.\d\dx off's mean gain|no ratio \(off's mean gain is not above 0\)); "
            r"minus off: [+-]\d\.\d{3} \(seed 3: no interval\)",
            lines[at + 2],
        ), lines[at + 2]
    # the last lines are the gains at equal wall-clock (a fresh seed: no warning after them)
    assert lines[-3] == "held-out gain at equal wall-clock, mean [95% interval]:"
    assert "chose this bench's settings" not in done.stdout
