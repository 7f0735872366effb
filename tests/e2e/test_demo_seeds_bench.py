"""bench/demo_seeds.py at its smallest setting (issue 42): the tiny demo, one seed, its
control run only (``--only-control``: the learner shuffles each step's rewards), a few
held-out tasks and one learner step; it prints the run's row with its verdict, the bar over
all runs, held-out success over the seeds, and writes the row to --json.

The demo it runs is `onthejob demo --tiny` on seed 0, whose warm-up is the one
tests/e2e/test_demo.py's tiny demo and test_demo_rl_offline_bench.py use (the session's
demo cache, ``--model-cache``): none is built for this test when they have run, and one
build serves all three. Seed 0 chose the demo's learning rate, and one seed makes no
interval: the bench says so ("NOT a learning figure"), as expected of a smoke run. The
learning run is the same demo without ``--control``: test_demo.py's tiny demo.
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

SEED = 0
HELDOUT_TASKS = 8
NOTE = " -- seeds 0 chose the learning rate: NOT a learning figure"


def test_the_smallest_setting_reports_its_run_the_bar_and_the_seeds_summary(
    tmp_path: Path, demo_cache: Path
) -> None:
    rows_file = tmp_path / "rows.json"
    workdir = tmp_path / "seeds"
    command = [
        *(sys.executable, "-m", "bench.demo_seeds", "--model", "tiny", "--seeds", str(SEED)),
        *("--only-control", "--minutes", "8", "--workdir", str(workdir)),
        *("--port", str(free_port()), "--json", str(rows_file)),
        # the demo's own flags: the cached warm-up, a few held-out runs, one training round
        *("--", "--model-cache", str(demo_cache), "--train-tasks", "24"),
        *("--heldout-tasks", str(HELDOUT_TASKS), "--eval-samples", "1"),
        *("--tasks-per-round", "4", "--group-size", "8", "--max-steps", "1", "--no-band-check"),
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
    lines = done.stdout.strip().splitlines()
    demo_out = workdir / f"seed-{SEED}-control" / "demo.out"
    said = demo_out.read_text()[-3000:] if demo_out.exists() else "(no demo.out)"
    assert "runs that gave no summary" not in done.stdout, said

    # the row: a control run of seed 0 on 8 held-out runs, one verified swap
    [row] = json.loads(rows_file.read_text())
    assert (row["seed"], row["control"]) == (SEED, True)
    for share in (row["before"], row["after"]):
        assert 0.0 <= share <= 1.0 and (share * HELDOUT_TASKS).is_integer()
    assert row["gain"] == pytest.approx(row["after"] - row["before"])
    assert row["swaps"] == 1
    assert 0 < row["learning_minutes"] <= row["minutes"] < 14
    assert row["workdir"] == str((workdir / f"seed-{SEED}-control").resolve())
    # a control meets its side of the bar when it gains no more than 5 points
    assert row["meets"] == (row["gain"] <= 0.05)
    # the exit status is the bar's verdict
    assert done.returncode == (0 if row["meets"] else 1), done.stderr[-3000:]

    warning = "WARNING: seeds (0, 1, 2) chose the demo's learning rate: no learning figure"
    assert lines[0] == warning
    verdict = "meets: control gains no more than 5 points" if row["meets"] else "MISSES: control"
    assert re.search(
        rf"^seed 0 control +\d+% +\d+% +[+-]\d+ +1 +\d+\.\d +\d+\.\d\d  {verdict}",
        done.stdout,
        re.M,
    ), done.stdout[-2000:]
    assert f"bar {'met' if row['meets'] else 'NOT met'} over 1 runs" in lines
    # held-out success over the seeds: the control's before, after and gain, no learning run
    at = lines.index("held-out success over the seeds, percent:")
    assert len(lines) == at + 4, lines[at:]
    for line, what in zip(lines[at + 1 :], ("before", "after", "gain"), strict=True):
        number = r"[+-]\d+\.\d" if what == "gain" else r"\d+\.\d"
        assert re.fullmatch(
            rf"control  {what:<7}{number} \(seed 0: no interval\){re.escape(NOTE)}", line
        ), line
    assert not any(line.startswith("learning ") for line in lines)
