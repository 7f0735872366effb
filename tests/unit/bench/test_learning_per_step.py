"""The held-out report of bench/learning_per_step.py: where arms are compared (equal steps,
equal wall-clock), which versions are measured, and what the report prints (issue 42)."""

from __future__ import annotations

import argparse

import pytest

from bench.learning_per_step import (
    FRESH_SEEDS,
    TUNED_SEEDS,
    ArmRun,
    equal_footing,
    gain_rows,
    heldout_report,
    parse_seeds,
    serving_at,
    steps_to_measure,
)
from bench.organic_traffic import unique_prompt
from bench.stats import seeds_are_fresh
from learner.toys.letter import HELDOUT_PROMPTS, PROMPTS


def run(
    seed: int, arm: str, serving_from: list[float], rewards: list[float], wall: float
) -> ArmRun:
    """An arm whose every version was measured: ``rewards[k]`` after k steps."""
    return ArmRun(seed, arm, tuple(serving_from), dict(enumerate(rewards)), wall)


def test_the_heldout_prompts_are_never_trained_on() -> None:
    assert not set(HELDOUT_PROMPTS) & set(PROMPTS)
    assert not set(HELDOUT_PROMPTS) & {unique_prompt(n) for n in range(100_000)}
    assert len(set(HELDOUT_PROMPTS)) == len(HELDOUT_PROMPTS) == len(PROMPTS)


def test_the_default_seeds_chose_no_setting() -> None:
    assert len(FRESH_SEEDS) >= 3
    assert seeds_are_fresh(FRESH_SEEDS, TUNED_SEEDS)
    assert parse_seeds("4, 5,6") == [4, 5, 6]
    with pytest.raises(argparse.ArgumentTypeError):
        parse_seeds("1,1,2")


def test_the_version_serving_at_a_time_is_the_last_one_begun_by_then() -> None:
    serving_from = [0.0, 10.0, 20.0, 30.0]
    assert serving_at(serving_from, 0.0) == 0
    assert serving_at(serving_from, 19.9) == 1
    assert serving_at(serving_from, 20.0) == 2
    assert serving_at(serving_from, 99.0) == 3


def test_arms_are_compared_at_the_fewest_steps_and_the_shortest_wall_time() -> None:
    assert equal_footing([25, 25, 12], [60.0, 200.0, 90.0]) == (12, 60.0)
    # an arm that took no step is at its start whatever the count: it does not pull the
    # others back to step 0
    assert equal_footing([0, 14, 31], [300.0, 310.0, 320.0]) == (14, 300.0)
    assert equal_footing([0, 0], [5.0, 6.0]) == (0, 5.0)


def test_the_measured_versions_include_both_comparison_points() -> None:
    serving_from = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]  # 8 steps
    assert steps_to_measure(serving_from, 8, 80.0, 3) == [0, 4, 8]
    assert steps_to_measure(serving_from, 5, 35.0, 3) == [0, 3, 4, 5, 8]
    assert steps_to_measure(serving_from, 8, 80.0, 1) == [0, 8]
    assert steps_to_measure([0.0], 0, 0.0, 3) == [0]


def test_gains_are_taken_at_equal_steps_and_at_equal_wall_clock_per_seed() -> None:
    runs = [
        # seed 1: bare fast (4 steps in 40 s), learner slow (4 steps in 160 s)
        run(1, "[1] bare", [0, 10, 20, 30, 40], [0.1, 0.2, 0.3, 0.4, 0.5], 41.0),
        run(1, "[2] learner", [0, 40, 80, 120, 160], [0.1, 0.3, 0.5, 0.7, 0.9], 161.0),
        # seed 2: the learner stopped after 2 steps
        run(2, "[1] bare", [0, 10, 20, 30, 40], [0.2, 0.2, 0.3, 0.3, 0.4], 45.0),
        run(2, "[2] learner", [0, 5, 15], [0.2, 0.4, 0.6], 20.0),
    ]
    rows = {(r["seed"], r["arm"]): r for r in gain_rows(runs)}
    bare, learner = rows[1, "[1] bare"], rows[1, "[2] learner"]
    assert bare["steps"] == learner["steps"] == 4
    assert bare["gain_steps"] == pytest.approx(0.4)
    assert learner["gain_steps"] == pytest.approx(0.8)
    # at 41 s the bare loop serves its last version, the learner the one after step 1
    assert (bare["seconds"], bare["step_at_seconds"], learner["step_at_seconds"]) == (41.0, 4, 1)
    assert learner["gain_seconds"] == pytest.approx(0.2)
    # seed 2: compared at 2 steps and at 20 s (the learner's wall time)
    bare, learner = rows[2, "[1] bare"], rows[2, "[2] learner"]
    assert bare["steps"] == learner["steps"] == 2
    assert bare["gain_steps"] == pytest.approx(0.1)
    assert learner["gain_steps"] == pytest.approx(0.4)
    assert (bare["step_at_seconds"], learner["step_at_seconds"]) == (2, 2)


def three_seeds() -> list[dict]:
    runs = []
    for seed, gain in ((1, 0.2), (2, 0.3), (3, 0.4)):
        runs.append(run(seed, "[1] bare", [0, 10, 20], [0.1, 0.1 + gain / 2, 0.1 + gain], 21))
        runs.append(run(seed, "[2] learner", [0, 30, 60], [0.1, 0.1 + gain, 0.1 + 2 * gain], 61))
    return gain_rows(runs)


def test_the_report_prints_every_arm_of_every_seed_and_each_arm_summarised() -> None:
    lines, results = heldout_report(
        three_seeds(), reference="[1] bare", tuned_on=TUNED_SEEDS, samples=16
    )
    text = "\n".join(lines)
    assert f"{len(HELDOUT_PROMPTS)} prompts never trained on, 16 replies each" in text
    per_seed = [line for line in lines if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert len(per_seed) == 6  # every arm of every seed
    at_steps = lines.index("held-out gain at equal steps, mean [95% interval]:")
    at_time = lines.index("held-out gain at equal wall-clock, mean [95% interval]:")
    # the bare loop: gains 0.2, 0.3, 0.4 at 2 steps; the learner 0.4, 0.6, 0.8
    assert lines[at_steps + 1].startswith("  [1] bare: +0.300 [")
    assert lines[at_steps + 1].endswith("(seeds 1, 2, 3)")
    assert lines[at_steps + 2].startswith("  [2] learner: +0.600 [")
    assert "2.00x [1] bare's mean gain" in lines[at_steps + 2]
    assert "minus [1] bare: +0.300 [" in lines[at_steps + 2]
    # at 21 s the learner served its first version only (30 s): no gain yet
    assert lines[at_time + 2].startswith("  [2] learner: +0.000 [")
    assert "0.00x [1] bare's mean gain" in lines[at_time + 2]
    assert results["arms"]["[2] learner"]["gain_steps"]["ratio_to_reference"] == pytest.approx(2)
    assert "best" not in text
    assert "not a learning figure" not in text
    assert lines[-1] == text.splitlines()[-1]
    named, _ = heldout_report(
        three_seeds(), reference="[1] bare", tuned_on=TUNED_SEEDS, samples=16, headline="[1] bare"
    )
    assert named[:-1] == lines  # the named arm's line comes last, whatever its rank
    assert named[-1].startswith("headline, [1] bare: held-out gain at equal wall-clock +")
    assert "; at equal steps +0.300 [" in named[-1]


def test_tuned_seeds_and_too_few_seeds_are_called_what_they_are() -> None:
    rows = [r for r in three_seeds() if r["seed"] != 3]
    lines, _ = heldout_report(rows, reference="[1] bare", tuned_on=[2], samples=4)
    text = "\n".join(lines)
    assert "seed(s) 2 chose this bench's settings: not a learning figure" in text
    assert "fewer than 3 seeds: not a learning figure" in text


def test_a_reference_that_did_not_gain_gives_no_ratio() -> None:
    runs = []
    for seed in (1, 2, 3):
        runs.append(run(seed, "off", [0.0], [0.1], 30.0))
        runs.append(run(seed, "version", [0, 10, 20], [0.1, 0.2, 0.3], 30.0))
    lines, results = heldout_report(gain_rows(runs), reference="off", tuned_on=(0,), samples=2)
    assert any("no ratio (off's mean gain is not above 0)" in line for line in lines)
    assert results["arms"]["version"]["gain_steps"]["minus_reference"] == pytest.approx(0.2)
