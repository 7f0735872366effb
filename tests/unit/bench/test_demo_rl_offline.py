"""bench/demo_rl_offline.py's report: every seed, then means with intervals over the seeds."""

from __future__ import annotations

import argparse
import re

from bench.demo_rl_offline import DEFAULT_SEEDS, TUNED_ON, Curve, arm_name, summary_lines
from bench.stats import seeds_are_fresh


def curve(seed: int, before: float, after: float) -> Curve:
    return Curve(seed, ((0, before), (10, (before + after) / 2), (30, after)))


def test_the_default_seeds_are_not_those_the_learning_rate_was_chosen_on() -> None:
    seeds = [int(s) for s in DEFAULT_SEEDS.split(",")]
    assert len(seeds) >= 3 and seeds_are_fresh(seeds, TUNED_ON)


def test_the_report_prints_every_seed_then_before_after_and_the_gain_with_intervals() -> None:
    curves = [curve(3, 0.20, 0.40), curve(4, 0.30, 0.40), curve(5, 0.25, 0.55)]
    lines = summary_lines("grpo lr 0.0001", curves, 30)
    assert lines[:3] == [
        "[offline] grpo lr 0.0001 seed 3: held-out 0.200 -> 0.400 (+0.200) in 30 steps",
        "[offline] grpo lr 0.0001 seed 4: held-out 0.300 -> 0.400 (+0.100) in 30 steps",
        "[offline] grpo lr 0.0001 seed 5: held-out 0.250 -> 0.550 (+0.300) in 30 steps",
    ]
    assert lines[3].startswith("[offline] grpo lr 0.0001 held-out before: 0.250 [")
    assert lines[4].startswith("[offline] grpo lr 0.0001 held-out after: 0.450 [")
    gain = re.fullmatch(
        r"\[offline\] grpo lr 0.0001 gain in 30 steps: \+0\.200 \[(\S+), (\S+)\] "
        r"\(seeds 3, 4, 5\)",
        lines[5],
    )
    assert gain is not None, lines[5]
    # mean 0.2, sd 0.1, t(2) 4.303: half-width 0.248
    assert float(gain[1]) == -0.048 and float(gain[2]) == 0.448


def test_seeds_that_chose_the_learning_rate_make_no_learning_figure() -> None:
    last = summary_lines("x", [curve(0, 0.2, 0.4), curve(1, 0.2, 0.5), curve(2, 0.1, 0.3)], 30)
    assert last[-1].endswith("chose the demo's learning rate: no learning figure")
    one = summary_lines("x", [curve(3, 0.2, 0.4)], 30)
    assert "no interval" in one[-1]


def test_the_arm_is_named_by_every_setting_it_compares() -> None:
    args = argparse.Namespace(advantage="random", lr=3e-4, optimizer="sgd", temperature=0.7, lora=8)
    assert arm_name(args) == "random lr 0.0003 sgd t 0.7 lora 8"
