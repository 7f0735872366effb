"""The offline GRPO bench's smallest setting, end to end (bench/demo_rl_offline.py): seed 0's
warmed-up demo model (the tiny demo's, shared through the demo cache), two steps of one
group; it prints its run and its summary, and says that seed 0 gives no learning figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]


def test_the_smallest_setting_runs_and_ends_with_the_gain_line(demo_cache: Path) -> None:
    command = [
        *(sys.executable, "-m", "bench.demo_rl_offline", "--cache", str(demo_cache)),
        *("--seeds", "0", "--steps", "2", "--tasks-per-step", "1", "--group-size", "4"),
        *("--heldout", "6", "--eval-samples", "1", "--eval-every", "2"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"\[offline\] grpo lr 0\.0001 adamw t 1 gain in 2 steps: \S+ .* -- seeds \(0, 1, 2\) "
        r"chose the demo's learning rate: no learning figure",
        last,
    ), last
    assert "seed 0 step   2" in done.stdout
