"""What the dashboard's figures are made of: round bucket sizes that fit a run, the
confidence band of a bucket's mean reward, versions in the order they served."""

from __future__ import annotations

import math
import statistics
from datetime import timedelta

import pytest

from store.learning_curves import ROUND_SECONDS, band, bucket_seconds
from store.version_order import version_order


@pytest.mark.parametrize(
    ("span", "buckets", "size"),
    [
        (timedelta(minutes=10), 30, 30),  # a 10-minute demo: 20 points, not one hourly dot
        (timedelta(minutes=10), 60, 10),
        (timedelta(hours=3, minutes=20), 30, 600),
        (timedelta(days=1), 30, 3600),
        (timedelta(days=60), 30, 2 * 86400),
        (timedelta(seconds=0), 30, 10),  # a single graded trajectory
        (timedelta(days=3000), 30, 100 * 86400),  # past the round sizes: whole days
    ],
)
def test_the_bucket_is_the_smallest_round_size_that_fits(
    span: timedelta, buckets: int, size: int
) -> None:
    assert bucket_seconds(span, buckets) == size
    assert span.total_seconds() / size <= buckets
    smaller = [s for s in ROUND_SECONDS if s < size]
    assert not smaller or span.total_seconds() / smaller[-1] > buckets


def test_the_band_is_the_mean_plus_minus_1_96_standard_errors() -> None:
    rewards = [0.0, 0.25, 1.0, 1.0, 0.5]
    mean = statistics.fmean(rewards)
    low, high = band(len(rewards), mean, statistics.fmean(r * r for r in rewards))
    half = 1.959964 * statistics.stdev(rewards) / math.sqrt(len(rewards))
    assert low == pytest.approx(mean - half)
    assert high == pytest.approx(mean + half)
    assert band(1, 0.5, 0.25) == (None, None)
    same = band(4, 1.0, 1.0)  # no spread: the band closes on the mean
    assert same[0] == pytest.approx(1.0) and same[1] == pytest.approx(1.0)


def test_versions_sort_by_the_order_they_served_then_by_number() -> None:
    names = ["step-10-a1", "step-2-b2", "base", None, "step-1-c3", "v10", "v9"]
    ordinals = {"base": 0, "step-1-c3": 1, "step-2-b2": 2, "step-10-a1": 10}
    assert sorted(names, key=version_order(ordinals)) == [
        "base", "step-1-c3", "step-2-b2", "step-10-a1", "v9", "v10", None,
    ]  # fmt: skip
    unknown = ["step-11", "step-2", "step-1", "step-10"]
    assert sorted(unknown, key=version_order({})) == ["step-1", "step-2", "step-10", "step-11"]
