"""bench/tenant_scale.py at its smallest setting on the tiny model (issue 46): a process per
tenant count, its memory and a tenant's step printed; adapters published both ways,
interleaved and verified; each figure's verdict, and the last line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_smallest_setting_prints_every_figure_and_its_last_line(
    tiny_model: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.json"
    command = [
        *(sys.executable, "-m", "bench.tenant_scale", "--model", str(tiny_model)),
        *("--dtype", "float32", "--tenants", "1,8", "--steps", "1", "--publishes", "1"),
        *("--json", str(rows)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    for n in (1, 8):
        assert any(re.match(rf"\s+{n} tenant\(s\): PSS \d+ MB", line) for line in lines), lines
    assert any(line.startswith("  from disk: median ") for line in lines), lines
    parts = r"    of it \(medians\): the trainer's forward on the probe \d+ ms, the adapter's files"
    assert any(re.match(parts, line) for line in lines), lines
    assert re.fullmatch(
        r"tenants: 8 -> \d+\.\d\dx memory of 1, 32 -> not measured; "
        r"adapter publish (\d+ ms|not measured) \(disk \d+ ms\)",
        lines[-1],
    ), lines[-8:]
    verdict = [line for line in lines if line.startswith(("PASS ", "FAIL "))]
    assert len(verdict) == 4 and "32 tenants against 1: not measured" in verdict[1], verdict
    assert rows.exists()
