"""The training-traffic detail of bench/organic_traffic.py: reward windows in call order,
each arm against the first, never against the best (issue 42)."""

from __future__ import annotations

import pytest

from bench.learning_per_step import Arm, Curve
from bench.organic_traffic import print_windows, unique_prompt, window_gain, windows


def test_every_prompt_is_unique() -> None:
    assert len({unique_prompt(n) for n in range(1000)}) == 1000


def test_windows_drop_a_short_last_window_and_gain_is_last_two_minus_first() -> None:
    curve = Curve("version", by_call=[0.0] * 10 + [0.2] * 10 + [0.4] * 10 + [1.0] * 4)
    assert windows(curve, 10) == [0.0, 0.2, 0.4]
    assert window_gain([0.0, 0.2, 0.4]) == pytest.approx(0.3)
    assert window_gain([0.0, 0.2]) != window_gain([0.0, 0.2])  # nan: too few windows


def test_each_arm_is_compared_with_the_first_not_the_best(capsys: pytest.CaptureFixture) -> None:
    arms = [Arm("learner", {"type_baseline": m}, m) for m in ("off", "version")]
    curves = [
        Curve("off", by_call=[0.1] * 30),
        Curve("version", by_call=[0.1] * 10 + [0.3] * 20),
    ]
    results = print_windows(arms, curves, 10)
    out = capsys.readouterr().out
    assert "not a learning figure" in out
    assert "best" not in out
    assert results["version"]["window_gain"] == pytest.approx(0.2)
