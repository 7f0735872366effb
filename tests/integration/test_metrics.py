"""GET /metrics: Prometheus text that a Prometheus parser reads, with request counts and
latencies by route and status, the recording backlog and the learner's figures; the app
in-process (tests/support/inprocess.py) on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from learner.vllm_server import free_port
from proxy.metrics import RequestStats, route_label
from store import policy_versions, training_steps
from tests.support.inprocess import in_process_client, wait_for_health


def scrape(proxy: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = proxy.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_requests_and_show_the_learner(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = {"upstreams": [dead], "database_url": db_url, "admin_token": "t"}
    with in_process_client(spool_path=tmp_path / "spool.jsonl", **settings) as proxy:
        figures(proxy, engine, dead)


def figures(proxy: httpx.Client, engine: Engine, dead: str) -> None:
    proxy.get("/admin/api/learner")  # 401
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/chat/completions", "/s/some-session/v1/chat/completions"):
        assert proxy.post(path, json=body).status_code == 502
    wait_for_health(proxy, lambda h: h["recording"]["written"] >= 2, "two calls written")
    with engine.begin() as conn:
        policy_versions.add_version(
            conn,
            version="step-3",
            ordinal=3,
            parent=None,
            checkpoint_path="/c",
            status="serving",
            swap_seconds=0.25,
        )
        training_steps.add_step(
            conn, step=3, version="step-3", metrics={"mean_reward": 0.625, "swap_seconds": 0.25}
        )
    before = scrape(proxy)
    for _ in range(3):
        proxy.get("/healthz")
    metrics = scrape(proxy)

    def value(name: str, **labels: str) -> float:
        return metrics[(name, tuple(sorted(labels.items())))]

    healthz = ("onthejob_http_requests_total", (("route", "/healthz"), ("status", "200")))
    assert metrics[healthz] - before[healthz] == 3
    assert value("onthejob_http_requests_total", route="/admin/api", status="401") == 1
    # the session key never becomes a label: both calls count under one route
    chat = value("onthejob_http_requests_total", route="/v1/chat/completions", status="502")
    assert chat == 2
    latency = "onthejob_http_request_duration_seconds"
    labels = {"route": "/v1/chat/completions", "status": "502"}
    assert value(latency + "_count", **labels) == 2
    assert value(latency + "_bucket", le="+Inf", **labels) == 2
    assert 0 < value(latency + "_sum", **labels) < 60
    assert value("onthejob_records_written") >= 2
    assert value("onthejob_recording_queue_depth") == 0
    assert value("onthejob_recording_queue_limit_calls") > 0
    assert value("onthejob_recording_queue_limit_bytes") > 0
    assert value("onthejob_recording_backlog_calls") == 0
    assert value("onthejob_recording_backlog_bytes") == 0
    assert value("onthejob_recording_log_bytes") > 0  # the two calls' lines, until rotated
    assert value("onthejob_upstream_healthy", upstream=dead) == 0
    assert value("onthejob_learner_step") == 3
    assert value("onthejob_learner_reward") == 0.625
    assert value("onthejob_learner_swap_seconds") == 0.25
    assert value("onthejob_serving_swap_seconds") == 0.25
    assert value("onthejob_serving_version_ordinal") == 3


def test_route_labels_are_bounded() -> None:
    assert route_label("/s/abc/v1/messages") == "/v1/messages"
    assert route_label("/v1/responses/resp_123") == "/v1/responses/{id}"
    assert route_label("/v1/embeddings") == "/v1/*"
    assert route_label("/admin/api/trajectories/x") == "/admin/api"
    assert route_label("/admin/static/app.js") == "/admin"
    assert route_label("/wp-login.php") == "other"
    assert route_label("/s/") == "other"


def test_request_histogram_buckets_are_cumulative_and_inclusive() -> None:
    stats = RequestStats()
    for seconds in (0.001, 0.002, 0.5, 400.0):
        stats.observe("/v1/completions", 200, seconds)
    requests, latency = stats.families()
    assert [s.value for s in requests.samples] == [4]
    buckets = {s.labels["le"]: s.value for s in latency.samples if s.name.endswith("_bucket")}
    assert buckets["0.001"] == 1  # le is inclusive
    assert buckets["0.005"] == 2 and buckets["0.5"] == 3 and buckets["300.0"] == 3
    assert buckets["+Inf"] == 4
    [total] = [s.value for s in latency.samples if s.name.endswith("_sum")]
    assert total == 0.001 + 0.002 + 0.5 + 400.0
