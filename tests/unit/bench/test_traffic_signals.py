"""bench/traffic_signals.py's report: every arm over the seeds, and a named arm's headline."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import traffic_signals as bench
from bench.traffic_signals import (
    DEFAULT_ARMS,
    TUNED_ON,
    ArmResult,
    arm_config,
    known_arm,
    report,
    share_summary,
    user_args,
)


def rows(gains: dict[str, list[float]], seeds: tuple[int, ...] = (3, 4, 5)) -> list[ArmResult]:
    """One row per seed and arm, from 0.10 before to 0.10 + gain after."""
    return [
        ArmResult(
            arm, seed, before=0.10, after=0.10 + gain, steps=10, minutes=3.0, learning_minutes=2.0
        )
        for seed_index, seed in enumerate(seeds)
        for arm, by_seed in gains.items()
        for gain in [by_seed[seed_index]]
    ]


RUN = rows(
    {
        "reference": [0.40, 0.20, 0.30],
        "next_turn": [0.10, 0.10, 0.30],
        "turn_credit": [0.20, 0.10, 0.15],
        "turn_credit:clean": [0.40, 0.20, 0.30],
    }
)


def test_the_headline_is_the_named_arm_beside_its_noiseless_arm_not_the_best() -> None:
    lines, out = report(RUN, noise=0.15, silent=0.1)
    # next_turn's mean share (58%) is the best of the noisy arms; the headline names
    # turn_credit (50%)
    assert lines[-1] == (
        "next-turn signals, percent of the reference-graded gain: turn_credit (user noise "
        "0.15, silent 0.1) 50 [50, 50] (seeds 3, 4, 5); noiseless (turn_credit:clean) "
        "100 [100, 100] (seeds 3, 4, 5)"
    )
    assert out["shares"]["next_turn"]["mean"] == pytest.approx((25 + 50 + 100) / 3)


def test_every_row_and_every_arm_is_printed() -> None:
    lines, out = report(RUN, noise=0.15, silent=0.1)
    assert sum(line.startswith(("reference ", "next_turn ", "turn_credit")) for line in lines) == 12
    assert set(out["gains"]) == {"reference", "next_turn", "turn_credit", "turn_credit:clean"}
    assert set(out["shares"]) == {"next_turn", "turn_credit", "turn_credit:clean"}
    gain_line = next(line for line in lines if line.startswith("  reference "))
    assert gain_line.split()[1:] == ["+30.0", "[+5.2,", "+54.8]", "(seeds", "3,", "4,", "5)"]


def test_a_seed_without_reference_gain_is_left_out_of_the_shares_and_named() -> None:
    run = rows({"reference": [0.40, 0.0, 0.20], "turn_credit": [0.20, 0.10, 0.10]})
    share, left_out = share_summary(run, "turn_credit")
    assert share is not None and share.seeds == (3, 5) and left_out == [4]
    lines, _ = report(run, noise=0.15, silent=0.1)
    assert any("left out: seeds 4" in line for line in lines)
    assert "not a learning figure" in lines[-1]  # two seeds left


def test_seeds_that_chose_settings_are_flagged_on_every_figure() -> None:
    run = rows({"reference": [0.4, 0.2, 0.3], "turn_credit": [0.2, 0.1, 0.15]}, seeds=(0, 1, 3))
    lines, _ = report(run, noise=0.15, silent=0.1)
    flagged = [line for line in lines if "seeds 0, 1 chose settings: NOT a learning figure" in line]
    assert len(flagged) == 6  # two gains, one share, two gains a minute, the headline
    assert set(TUNED_ON) == {0, 1, 2}


def test_no_headline_without_the_named_arm() -> None:
    lines, _ = report(rows({"reference": [0.4, 0.2, 0.3]}), noise=0.15, silent=0.1)
    assert lines[-1].startswith("next-turn signals (turn_credit): not measured")


def test_arms_and_their_noiseless_twins() -> None:
    assert all(known_arm(a) for a in DEFAULT_ARMS)
    assert not known_arm("reference:clean") and not known_arm("turn_credit:cleanx")
    assert user_args("turn_credit:clean", 3, 0.15, 0.1) == [
        *("--seed", "3", "--noise", "0.0", "--silent", "0.0")
    ]
    assert user_args("turn_credit", 3, 0.15, 0.1)[3:] == ["0.15", "--silent", "0.1"]


def test_an_arms_config_carries_its_seed_to_the_demo_and_the_user(tmp_path: Path) -> None:
    args = argparse.Namespace(
        model="tiny", port=8093, minutes=30.0, steps=10, noise=0.15, silent=0.1, hindsight=1.0
    )
    config = arm_config("turn_credit:clean", 4, args, tmp_path)
    assert config.seed == 4
    assert config.train_grader == "next_turn"
    assert config.learner_args == ("--credit", "turn")
    assert config.train_harness[-6:] == ["--seed", "4", "--noise", "0.0", "--silent", "0.0"]
    assert arm_config("reference", 4, args, tmp_path).train_harness is None


def test_a_plain_run_measures_every_default_arm_on_every_fresh_seed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m bench.traffic_signals` on its defaults, each demo run stubbed."""
    ran: list[tuple[str, int]] = []

    def fake_run(arm: str, seed: int, args: argparse.Namespace, root: Path) -> ArmResult:
        ran.append((arm, seed))
        return ArmResult(arm, seed, before=0.1, after=0.4, steps=args.steps, minutes=0.1)

    monkeypatch.setattr(bench, "run_arm", fake_run)
    assert bench.main([]) == 0
    assert ran == [(arm, seed) for seed in (3, 4, 5) for arm in DEFAULT_ARMS]
    printed = capsys.readouterr().out
    assert "NOT a learning figure" not in printed
    assert (
        printed.strip()
        .splitlines()[-1]
        .startswith(
            "next-turn signals, percent of the reference-graded gain: turn_credit (user noise 0.15"
        )
    )


def test_a_smaller_run_takes_the_demos_own_sizes_and_cache(tmp_path: Path) -> None:
    """The flags of a smoke run reach the demo; left out, the demo's defaults stand."""
    from learner.demo.run import DemoConfig

    given = {
        "heldout_tasks": 8, "eval_samples": 2, "train_tasks": 24, "tasks_per_round": 2,
        "group_size": 4, "model_cache": tmp_path / "cache",
    }  # fmt: skip
    args = argparse.Namespace(
        model="tiny", port=8093, minutes=30.0, steps=1, noise=0.15, silent=0.1, hindsight=1.0
    )
    for arm in ("reference", "turn_credit"):
        config = arm_config(arm, 0, argparse.Namespace(**vars(args), **given), tmp_path)
        assert {name: getattr(config, name) for name in given} == given
    plain = arm_config("reference", 0, args, tmp_path)
    default = DemoConfig()
    assert {name: getattr(plain, name) for name in given} == {
        name: getattr(default, name) for name in given
    }


def test_the_demos_sizes_are_flags_and_default_to_the_demos(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[argparse.Namespace] = []

    def fake_run(arm: str, seed: int, args: argparse.Namespace, root: Path) -> ArmResult:
        seen.append(args)
        return ArmResult(arm, seed, before=0.1, after=0.4, steps=args.steps, minutes=0.1)

    monkeypatch.setattr(bench, "run_arm", fake_run)
    flags = ["--arms", "reference", "--seeds", "3"]
    assert bench.main(flags) == 0
    assert all(getattr(seen[0], name) is None for name in (*bench.DEMO_SIZES, "model_cache"))
    sizes = ["--heldout-tasks", "8", "--eval-samples", "2", "--train-tasks", "24"]
    sizes += ["--tasks-per-round", "2", "--group-size", "4", "--model-cache", str(tmp_path)]
    assert bench.main(flags + sizes) == 0
    assert (seen[1].heldout_tasks, seen[1].eval_samples, seen[1].train_tasks) == (8, 2, 24)
    assert (seen[1].tasks_per_round, seen[1].group_size) == (2, 4)
    assert seen[1].model_cache == tmp_path


def test_every_arm_is_compared_at_equal_wall_clock_too() -> None:
    """The steps are equal by construction; the gain per minute of learning puts the arms
    side by side on the clock (a judge's grading costs minutes)."""
    slow = [
        ArmResult(r.arm, r.seed, r.before, r.after, r.steps, r.minutes, learning_minutes=8.0)
        if r.arm == "next_turn"
        else r
        for r in RUN
    ]
    lines, out = report(slow, noise=0.15, silent=0.1)
    at = lines.index("gain per minute of learning, points (equal wall-clock; the steps are equal):")
    # reference gains 40, 20 and 30 points in 2 minutes each; next_turn 10, 10, 30 in 8
    assert lines[at + 1].split()[:2] == ["reference", "+15.00"]
    assert lines[at + 2].split()[:2] == ["next_turn", "+2.08"]
    assert out["gain_per_minute"]["next_turn"]["seeds"] == (3, 4, 5)
    unknown = [ArmResult(r.arm, r.seed, r.before, r.after, r.steps, r.minutes) for r in RUN]
    lines, out = report(unknown, noise=0.15, silent=0.1)
    assert f"  {'reference':<18} not measured" in lines
    assert out["gain_per_minute"]["reference"] is None
