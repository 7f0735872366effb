"""The flat-cost series' trend line and the host wake-up probe (bench/)."""

from __future__ import annotations

import os

import pytest

from bench import host_wakeup
from bench.volume_series import _trend


def test_a_steady_growth_reads_as_a_trend_and_alternating_noise_does_not() -> None:
    growing = [1000.0 + 50.0 * i for i in range(10)]  # +450 over a mean of 1225: +36.7%
    # a palindrome: segments that swing 10% either way with no drift from first to last
    noisy = [1100.0, 900.0, 1100.0, 900.0, 1100.0, 1100.0, 900.0, 1100.0, 900.0, 1100.0]
    assert _trend(growing).startswith("+36.7% over the run")
    assert "scatter 0.0%" in _trend(growing)
    assert _trend(noisy).startswith("+0.0% over the run")
    assert "scatter 9.6%" in _trend(noisy)


def test_too_few_segments_have_no_trend() -> None:
    assert _trend([1.0, 2.0]).startswith("n/a")


def test_the_wakeup_probe_measures_a_round_trip_and_restores_affinity() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    assert host_wakeup.round_trip_us(cpu, cpu, rounds=200) > 0.0
    assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_header_line_names_both_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    line = host_wakeup.describe(cpus)
    assert f"between CPUs {cpus[0]} and {cpus[1]}" in line
