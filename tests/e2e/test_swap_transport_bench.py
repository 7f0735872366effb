"""bench/swap_transport.py at its smallest setting on the tiny model: both arms warmed up
alike and interleaved, each swap timed by the wall clock, and its last line the ratio
(issue 42). It starts its own replica (with our weight-transfer engine)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_smallest_setting_ends_in_a_wall_clock_ratio(tiny_model: Path) -> None:
    command = [
        *(sys.executable, "-m", "bench.swap_transport", "--model", str(tiny_model)),
        *("--dtype", "float32", "--swaps", "1", "--warmup", "1", "--steps", "1", "--no-channel"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"swap speed-up, transfer vs disk: \d+\.\dx", lines[-1]), lines[-5:]
    # warm-up round disk first, measured round transfer first: interleaved, alike
    swaps = [line.split(":")[0].strip() for line in lines if "s wall-clock, " in line]
    assert swaps == ["disk-0", "transfer-0", "transfer-1", "disk-1"], swaps
    for arm in ("disk", "transfer"):
        assert any(
            line.startswith(f"{arm}: step end -> first answer, wall-clock: median ")
            and "of 1 swaps (after 1 warm-up)" in line
            for line in lines
        ), lines
    assert any(re.fullmatch(r"transfer vs disk, round by round: \d+\.\d\dx \(min .*\)", line)
               for line in lines), lines  # fmt: skip
