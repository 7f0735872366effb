"""`GET /metrics` in the Prometheus text format, and the cheap request instrumentation.

Per request: a perf_counter pair, a cached route label and two additions to plain lists
(RequestStats). Everything else (recording backlog, upstream health, learner step, reward,
swap time) is read when scraped.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import time
from typing import Any, TypedDict

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.state import ProxyState
from store import grade_queue, policy_versions, training_steps, watch_alerts
from store.json_types import JsonValue

log = logging.getLogger("onthejob.metrics")

# upper bounds (seconds) of the latency histogram's buckets
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RequestStats:
    """Count, latency sum and histogram buckets per (route, status).

    Updated only on the event loop, without locks: prometheus_client's own Counter and
    Histogram cost ~4.5 us a request here (a lock each); this costs well under 1 us.
    Scrapes read it from a thread; each series is copied whole and its count derived from
    its buckets, so a scrape never shows a count that disagrees with them.
    """

    def __init__(self) -> None:
        self.series: dict[tuple[str, int], list[Any]] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        entry = self.series.get((route, status))
        if entry is None:
            entry = self.series[(route, status)] = [0.0, [0] * (len(BUCKETS) + 1)]
        entry[0] += seconds
        entry[1][bisect.bisect_left(BUCKETS, seconds)] += 1

    def families(self) -> list[Any]:
        requests = CounterMetricFamily(
            "onthejob_http_requests",
            "HTTP requests answered by the proxy, by route and status",
            labels=["route", "status"],
        )
        latency = HistogramMetricFamily(
            "onthejob_http_request_duration_seconds",
            "Time from request to the end of the response (whole stream)",
            labels=["route", "status"],
        )
        for (route, status), (total, buckets) in list(self.series.items()):
            counts = list(itertools.accumulate(list(buckets)))
            labels = [route, str(status)]
            requests.add_metric(labels, counts[-1])
            bounds = [*(str(float(b)) for b in BUCKETS), "+Inf"]
            latency.add_metric(labels, list(zip(bounds, counts, strict=True)), total)
        return [requests, latency]


_KNOWN = {
    p: p
    for p in (
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/v1/onthejob/feedback",
        "/healthz",
        "/metrics",
    )
}


def route_label(path: str) -> str:
    """A bounded set of labels: session keys and ids never become label values."""
    if path.startswith("/s/"):
        parts = path.split("/", 3)
        path = "/" + parts[3] if len(parts) > 3 else "/"
    known = _KNOWN.get(path)
    if known is not None:
        return known
    if path.startswith("/admin/api/"):
        return "/admin/api"
    if path.startswith("/admin"):
        return "/admin"
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    if path.startswith("/v1/"):
        return "/v1/*"
    return "other"


class MetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: it would buffer the hot path's streams)."""

    def __init__(self, app: ASGIApp, stats: RequestStats) -> None:
        self.app = app
        self.stats = stats
        self._labels: dict[str, str] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client gets if the app dies before answering
        start = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.stats.observe(self._label(scope["path"]), status, time.perf_counter() - start)

    def _label(self, path: str) -> str:
        label = self._labels.get(path)
        if label is None:
            label = route_label(path)
            if len(self._labels) < 4096:  # session paths are many: keep the cache bounded
                self._labels[path] = label
        return label


def middleware(stats: RequestStats) -> Middleware:
    """Counts into `stats`: one per app (two apps in one process, as in the in-process tests,
    count apart), which its /metrics reads from `app.state.request_stats`."""
    return Middleware(MetricsMiddleware, stats=stats)


class LearnerSnapshot(TypedDict):
    """The learner's figures a scrape shows, as the store has them."""

    watch: dict[str, watch_alerts.DetectorCount]
    step: int | None  # the last step recorded
    reward: JsonValue  # its metrics' mean_reward
    step_swap_seconds: JsonValue  # its metrics' swap_seconds
    serving_ordinal: int | None
    serving_swap_seconds: float | None
    ungraded: int


def _learner_snapshot(engine: Engine) -> LearnerSnapshot:
    with engine.connect() as conn:
        step = training_steps.latest_step(conn)
        serving = policy_versions.serving_version(conn)
        ungraded = grade_queue.count_ungraded_finished(conn)
        watch = watch_alerts.counts(conn)
    metrics = (step["metrics"] if step is not None else None) or {}
    return {
        "watch": watch,
        "step": None if step is None else step["step"],
        "reward": metrics.get("mean_reward"),
        "step_swap_seconds": metrics.get("swap_seconds"),
        "serving_ordinal": None if serving is None else serving["ordinal"],
        "serving_swap_seconds": None if serving is None else serving["swap_seconds"],
        "ungraded": ungraded,
    }


class _StateCollector(Collector):
    def __init__(
        self, state: ProxyState, stats: RequestStats, learner: LearnerSnapshot | None
    ) -> None:
        self.state = state
        self.stats = stats
        self.learner = learner

    def collect(self) -> Any:
        yield from self.stats.families()
        recording = self.state.recorder.status()
        for name, key, help_text in (
            ("recording_queue_depth", "queue_depth", "Calls the writer holds in memory"),
            ("recording_queue_bytes", "queue_bytes", "Bytes of the calls the writer holds"),
            ("recording_queue_limit_calls", "queue_limit_calls", "Bound on queue_depth"),
            ("recording_queue_limit_bytes", "queue_limit_bytes", "Bound on queue_bytes"),
            ("recording_backlog_calls", "backlog_calls", "Answered calls not yet in the DB"),
            ("recording_backlog_bytes", "backlog_bytes", "Call log bytes not yet in the DB"),
            ("recording_log_bytes", "log_bytes", "Size of the call log on disk"),
            ("recording_log_write_errors", "log_write_errors", "Call log writes that failed"),
            ("records_written", "written", "Records written to the database since start"),
            ("records_rejected", "rejected", "Records the database refused since start"),
        ):
            yield GaugeMetricFamily(f"onthejob_{name}", help_text, value=float(recording[key]))
        healthy = GaugeMetricFamily(
            "onthejob_upstream_healthy", "1 if the vLLM replica is reachable", labels=["upstream"]
        )
        for replica in self.state.pool.replicas:
            healthy.add_metric([replica.url], 1.0 if replica.healthy else 0.0)
        yield healthy
        yield from self._learner()

    def _learner(self) -> Any:
        learner = self.learner
        if learner is None:
            return
        for key, name, help_text in (
            ("step", "learner_step", "Last learner step recorded"),
            ("reward", "learner_reward", "Mean reward of the last step's batch"),
            ("step_swap_seconds", "learner_swap_seconds", "Hot-swap time of the last step"),
            ("serving_ordinal", "serving_version_ordinal", "Ordinal of the serving version"),
            ("serving_swap_seconds", "serving_swap_seconds", "Hot-swap time of the serving one"),
            ("ungraded", "learner_ungraded_trajectories", "Finished trajectories not graded"),
        ):
            value = learner.get(key)
            if isinstance(value, int | float):
                yield GaugeMetricFamily(f"onthejob_{name}", help_text, value=float(value))
        yield from _watch(learner["watch"])


def _watch(counts: dict[str, watch_alerts.DetectorCount]) -> Any:
    """The reward-hacking watch, per detector (every one, at 0 when quiet)."""
    active = GaugeMetricFamily(
        "onthejob_watch_alerts",
        "Reward-hacking watch alerts open now (a canary's hold its promotion), by detector",
        labels=["detector"],
    )
    raised = CounterMetricFamily(
        "onthejob_watch_alerts_raised",
        "Reward-hacking watch alerts ever raised, by detector",
        labels=["detector"],
    )
    for detector, count in counts.items():
        active.add_metric([detector], float(count.active))
        raised.add_metric([detector], float(count.raised))
    yield active
    yield raised


def _render(state: ProxyState, stats: RequestStats) -> bytes:
    try:
        learner: LearnerSnapshot | None = _learner_snapshot(state.recorder.engine)
    except SQLAlchemyError as exc:
        log.warning("metrics without learner figures: database error %s", exc)
        learner = None
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_StateCollector(state, stats, learner))
    return generate_latest(scrape)


async def endpoint(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    body = await asyncio.to_thread(_render, state, request.app.state.request_stats)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
