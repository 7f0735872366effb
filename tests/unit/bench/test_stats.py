"""The seeds' summary every learning figure is printed with (bench/stats.py)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from bench.stats import seeds_are_fresh, summarise, t_quantile


def test_the_interval_is_the_t_interval_of_the_seeds() -> None:
    summary = summarise([0.2, 0.4, 0.6], [3, 4, 5])
    assert summary.mean == pytest.approx(0.4)
    # sd 0.2, n 3: 4.303 * 0.2 / sqrt(3)
    assert summary.half_width == pytest.approx(4.303 * 0.2 / math.sqrt(3))
    assert summary.format(".2f") == "0.40 [-0.10, 0.90] (seeds 3, 4, 5)"


def test_one_seed_has_no_interval_and_two_are_not_a_learning_figure() -> None:
    assert summarise([0.5], [7]).format(".1f") == "0.5 (seed 7: no interval)"
    assert "not a learning figure" in summarise([0.1, 0.3], [1, 2]).format()
    assert not summarise([0.1, 0.3], [1, 2]).enough_seeds


def test_the_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(0)
    covered = 0
    for _ in range(2000):
        values = [rng.gauss(1.0, 0.5) for _ in range(3)]
        lo, hi = summarise(values, [0, 1, 2]).interval
        covered += lo <= 1.0 <= hi
    assert 0.93 <= covered / 2000 <= 0.97


def test_mismatched_or_empty_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        summarise([1.0, 2.0], [1])
    with pytest.raises(ValueError):
        summarise([], [])
    with pytest.raises(ValueError):
        t_quantile(0)
    assert t_quantile(100) == 1.96
    assert statistics.fmean([t_quantile(2)]) == 4.303


def test_seeds_used_to_choose_a_setting_are_not_fresh() -> None:
    assert seeds_are_fresh([3, 4, 5], tuned_on=[0, 1, 2])
    assert not seeds_are_fresh([2, 3, 4], tuned_on=[0, 1, 2])
