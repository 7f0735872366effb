"""learner/traffic.py: reading vLLM's busy gauges, and when a ready step waits."""

from __future__ import annotations

from collections.abc import Iterator

from learner.traffic import TrafficYield, busy_requests

# the shape of vLLM's /metrics (Prometheus text): labelled gauges, comments, a histogram
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="demo",reason="capacity"} 7.0
vllm:num_requests_running_total_seconds_bucket{le="1.0"} 11.0
"""


def test_busy_requests_sums_running_and_waiting_only() -> None:
    assert busy_requests(METRICS) == 5.0
    assert busy_requests(METRICS.replace(" 3.0", " 0.0").replace(" 2.0", " 0.0")) == 0.0
    assert busy_requests("") is None  # no gauge: not known, never taken for idle
    assert busy_requests('vllm:num_requests_running{engine="0"} 2.0 1700000000000') == 2.0


def scripted(values: list[float | None]) -> Iterator[float | None]:
    yield from values
    while True:
        yield values[-1]


def test_a_ready_step_waits_while_busy_and_trains_once_quiet() -> None:
    readings = scripted([2.0, 1.0, 0.0, 0.0, 0.0])
    traffic = TrafficYield(lambda: next(readings), limit_seconds=60, quiet_seconds=1.0)
    assert traffic.should_wait(now=100.0)  # 2 running
    assert traffic.should_wait(now=101.0)  # 1 running
    assert traffic.should_wait(now=102.0)  # idle, not yet for a second
    assert traffic.should_wait(now=102.5)
    assert not traffic.should_wait(now=103.0)  # idle for a second: train
    assert traffic.took(now=103.0) == 3.0
    # the next step waits anew
    assert traffic.ready_since is None and traffic.idle_since is None


def test_a_gap_in_traffic_shorter_than_the_quiet_time_does_not_start_a_step() -> None:
    readings = scripted([0.0, 4.0, 0.0, 0.0])
    traffic = TrafficYield(lambda: next(readings), limit_seconds=60, quiet_seconds=1.0)
    assert traffic.should_wait(now=0.0)  # idle since 0
    assert traffic.should_wait(now=0.5)  # busy again: the quiet time starts over
    assert traffic.should_wait(now=1.0)
    assert traffic.should_wait(now=1.9)
    assert not traffic.should_wait(now=2.0)


def test_traffic_that_never_pauses_delays_a_step_by_the_limit_at_most() -> None:
    traffic = TrafficYield(lambda: 8.0, limit_seconds=30)
    assert traffic.should_wait(now=0.0)
    assert traffic.should_wait(now=29.9)
    assert not traffic.should_wait(now=30.0)
    assert traffic.waited(now=30.0) == 30.0


def test_off_or_unknown_means_no_wait() -> None:
    assert not TrafficYield(lambda: 8.0, limit_seconds=0).should_wait(now=0.0)
    # unknown (no replica answered) waits, within the limit
    unknown = TrafficYield(lambda: None, limit_seconds=60)
    assert unknown.should_wait(now=0.0) and not unknown.should_wait(now=60.0)
