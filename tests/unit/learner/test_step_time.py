"""Where a step's time went (learner/step_time.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from learner.step_time import StepTime, median_seconds


def _time(**overrides: float | int | None) -> StepTime:
    values = dict(
        gathering=30.0, fresh_wait=5.0, yield_wait=0.0, training=92.0, training_cpu=46.0,
        threads=1, saving=2.5, swap=0.45, grading_lag=2.0, sample_age=25.0,
    )  # fmt: skip
    values.update(overrides)
    return StepTime(**values)  # type: ignore[arg-type]


def test_the_parts_add_up_and_the_line_names_each() -> None:
    times = _time()
    assert times.total == pytest.approx(129.95)
    assert times.summary() == (
        "time 129.9s since the last step: 30.0s gathering the batch (grading lag 2.0s, "
        "samples 25.0s old), 5.0s waiting for fresh samples, 0.0s for idle replicas, 92.0s "
        "training (1 thread computed 50% of the time: the rest went to other processes on "
        "its cores), 2.5s saving, 0.45s swap"
    )


def test_contention_is_the_share_of_the_threads_time_the_trainer_did_not_compute() -> None:
    assert _time(training=10.0, training_cpu=19.0, threads=2).cpu_share == pytest.approx(0.95)
    assert (
        "(2 threads computed 95% of the time)"
        in _time(training=10.0, training_cpu=19.0, threads=2).summary()
    )
    assert _time(training=10.0, training_cpu=30.0, threads=2).cpu_share == 1.0
    assert _time(training=0.0).cpu_share is None
    assert "trainer_cpu_share" not in _time(training=0.0).metrics()


def test_unknown_lags_are_left_out_of_the_line_and_the_metrics() -> None:
    times = _time(grading_lag=None, sample_age=None)
    assert "gathering the batch, " in times.summary()
    assert "grading_lag_seconds" not in times.metrics()
    assert _time().metrics()["grading_lag_seconds"] == 2.0


def test_median_seconds_skips_unknown_pairs() -> None:
    t = datetime(2026, 12, 6, tzinfo=UTC)
    pairs = [(t, t + timedelta(seconds=s)) for s in (1, 3, 10)] + [(None, t), (t, None)]
    assert median_seconds(pairs) == 3.0
    assert median_seconds([(None, None)]) is None


def test_replicas_paused_for_the_step_are_named_in_the_line() -> None:
    line = _time(training=15.0, training_cpu=27.0, threads=2, paused=1).summary()
    assert "(2 threads computed 90% of the time, 1 replica(s) on this host paused)" in line
    assert "paused" not in _time().summary()
