"""bench/gpu_check.py, the prepared GPU check: a part that would start after the budget is
skipped, and says so; the tenants' memory counts their one base once. Its whole CPU half runs
in tests/e2e/test_gpu_check_bench.py."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import torch

from bench.gpu_check import FIGURES, held_bytes, main, model_config, parse, tenant_trainer


def test_past_its_budget_no_figure_starts_and_each_line_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    threads = torch.get_num_threads()
    try:
        assert main(["--device", "cpu", "--budget-s=-1"]) == 0
    finally:
        torch.set_num_threads(threads)  # the CPU half runs one thread; the next test need not
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("summary")]
    assert [line.split()[1] for line in lines] == list(FIGURES)
    for line in lines:
        assert "CPU smoke figures, not measurements]: skipped: " in line
        assert re.search(r"no part starts after the -1 s budget; took \d+ s$", line), line


def test_the_tenants_share_one_base_and_hold_only_their_adapters_twice() -> None:
    args = parse(["--device", "cpu"])
    config = model_config(small=True)
    with tempfile.TemporaryDirectory() as base_dir:
        first = tenant_trainer(config, Path(base_dir), args)
        second = tenant_trainer(config, Path(base_dir), args)
        one, two = held_bytes([first]), held_bytes([first, second])
        adapter = sum(p.numel() * 4 for p in second.parameters)  # float32 masters
        base = sum(
            p.numel() * p.element_size() for p in first.model.parameters() if not p.requires_grad
        )
    # the second tenant adds its adapter (masters, bf16 copy; AdamW state after a step)
    assert two - one == adapter + adapter // 2
    assert base > 10 * adapter and one > base
