"""bench/demo_seeds.py's verdicts and its summary over fresh seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import demo_seeds as bench
from bench.demo_seeds import (
    DEFAULT_SEEDS,
    TUNED_ON,
    Run,
    model_args,
    summary_lines,
    table_lines,
)
from bench.stats import seeds_are_fresh


def run(seed: int, before: float, after: float, *, control: bool = False, swaps: int = 12) -> Run:
    return Run(seed, control, before, after, swaps, 10.0, 14.0, f"/tmp/seed-{seed}")


def test_the_default_seeds_are_not_those_the_learning_rate_was_chosen_on() -> None:
    seeds = [int(s) for s in DEFAULT_SEEDS.split(",")]
    assert len(seeds) >= 3 and seeds_are_fresh(seeds, TUNED_ON)
    assert TUNED_ON == (0, 1, 2)


def test_a_run_meets_the_bar_only_doubled_by_20_points_with_10_swaps_in_time() -> None:
    assert run(3, 0.25, 0.70).verdict() == (True, "doubled, +20 points, 10+ swaps in time")
    ok, why = run(4, 0.30, 0.55, swaps=9).verdict()
    assert not ok and why == "not doubled (1.83x); 9 verified swaps < 10"
    assert not run(5, 0.0, 0.15).verdict()[0]
    assert run(3, 0.22, 0.25, control=True).verdict()[0]
    assert run(3, 0.22, 0.30, control=True).verdict() == (False, "control gained 8 points (> 5)")


def test_the_table_prints_every_run_and_the_bar_over_all() -> None:
    lines, ok = table_lines([run(3, 0.25, 0.70), run(3, 0.22, 0.30, control=True)])
    assert len(lines) == 4 and not ok
    assert lines[1].startswith("seed 3") and "meets" in lines[1]
    assert lines[2].startswith("seed 3 control") and "MISSES" in lines[2]
    assert lines[-1] == "bar NOT met over 2 runs"


def test_the_summary_is_a_mean_and_interval_over_the_seeds_controls_apart() -> None:
    runs = [run(s, 0.2, 0.2 + g) for s, g in ((3, 0.4), (4, 0.6), (5, 0.5))]
    runs += [run(s, 0.2, 0.2, control=True) for s in (3, 4, 5)]
    lines = summary_lines(runs)
    assert lines[0] == "learning before 20.0 [20.0, 20.0] (seeds 3, 4, 5)"
    assert lines[2] == "learning gain   +50.0 [+25.2, +74.8] (seeds 3, 4, 5)"
    assert lines[5] == "control  gain   +0.0 [+0.0, +0.0] (seeds 3, 4, 5)"
    assert not any("NOT" in line for line in lines)


def test_seeds_that_chose_the_learning_rate_are_flagged() -> None:
    lines = summary_lines([run(s, 0.25, 0.7) for s in (0, 1, 2)])
    assert all(
        line.endswith("seeds 0, 1, 2 chose the learning rate: NOT a learning figure")
        for line in lines
    )


def test_fewer_than_three_seeds_is_no_learning_figure() -> None:
    assert "not a learning figure" in summary_lines([run(3, 0.25, 0.7), run(4, 0.2, 0.6)])[2]


def test_a_plain_run_runs_each_fresh_seed_with_its_control(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m bench.demo_seeds` on its defaults, each demo run stubbed."""

    def fake_demo(seed: int, control: bool, args: object, extra: list[str]) -> Run:
        return run(seed, 0.25, 0.27 if control else 0.75, control=control)

    monkeypatch.setattr(bench, "run_demo", fake_demo)
    assert bench.main([]) == 0
    printed = capsys.readouterr().out
    assert "learning gain   +50.0 [+50.0, +50.0] (seeds 3, 4, 5)" in printed
    assert "control  gain   +2.0 [+2.0, +2.0] (seeds 3, 4, 5)" in printed
    assert "WARNING" not in printed


def test_a_run_on_tuned_seeds_warns_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "run_demo", lambda seed, *_: run(seed, 0.25, 0.75))
    assert bench.main(["--seeds", "0,1,2", "--no-control"]) == 0
    assert capsys.readouterr().out.startswith("WARNING: seeds (0, 1, 2) chose")


def test_the_tiny_model_is_the_demos_tiny_flag() -> None:
    assert model_args("tiny") == ["--tiny"]
    assert model_args("smollm2-135m") == ["--model", "smollm2-135m"]


def test_the_exit_status_is_the_bar_and_the_json_has_every_run_with_its_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.json"

    def fake_demo(seed: int, control: bool, args: object, extra: list[str]) -> Run:
        if seed == 4:
            raise bench.DemoFailed("seed-4: the demo exited 1; its last lines:\n...")
        return run(seed, 0.25, 0.32 if control else 0.75, control=control)

    monkeypatch.setattr(bench, "run_demo", fake_demo)
    assert bench.main(["--seeds", "3", "--json", str(rows)]) == 1  # the control gained 5+
    written = json.loads(rows.read_text())
    assert [(r["seed"], r["control"], r["meets"]) for r in written] == [
        (3, False, True),
        (3, True, False),
    ]
    assert written[0]["gain"] == pytest.approx(0.5)
    assert bench.main(["--seeds", "3,4", "--no-control", "--json", str(rows)]) == 1
    assert "runs that gave no summary: seed-4" in capsys.readouterr().out
    assert [r["seed"] for r in json.loads(rows.read_text())] == [3]
    assert bench.main(["--seeds", "3", "--no-control"]) == 0
    capsys.readouterr()
    # no run gave a summary: the bar is not met over none (it said "met over 0 runs")
    assert bench.main(["--seeds", "4", "--no-control"]) == 1
    assert "bar NOT met over 0 runs" in capsys.readouterr().out.splitlines()
