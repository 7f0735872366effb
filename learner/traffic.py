"""How busy the replicas are, from vLLM's Prometheus metrics: the learner's way to yield.

Where the trainer and vLLM share the same cores (a CPU box) or the same GPU, a step taken
while vLLM generates slows both: on 2 cores a 5 s step took 20-37 s under a round of
traffic. With ``--yield-to-traffic S`` a step that is ready waits while any replica is
running or queueing requests, for up to S seconds, and trains once they have been idle for
a moment (``QUIET_SECONDS``) or the S seconds are up: traffic that never pauses delays a
step by at most S, never starves it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from learner.step_wait import ReadySince

log = logging.getLogger("onthejob.learner")

# vLLM's gauges (vllm/v1/metrics/loggers.py): requests being generated, requests queued
BUSY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# idle this long before a step starts: a round's calls come back to back, with short gaps
# between one call and an agent's next
QUIET_SECONDS = 1.0


def busy_requests(metrics_text: str) -> float | None:
    """Requests running or waiting in one replica's /metrics text (every label set summed);
    None when it has neither gauge (not vLLM, or vLLM with --disable-log-stats)."""
    total, found = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in BUSY_GAUGES:
            # NAME{labels} VALUE [TIMESTAMP]: the value follows the labels
            fields = line[len(name) :].rsplit("}", 1)[-1].split()
            try:
                total += float(fields[0])
                found = True
            except (IndexError, ValueError):
                continue
    return total if found else None


def replicas_busy(upstreams: Sequence[str], timeout: float = 2.0) -> float | None:
    """Requests running or waiting over all replicas; None when none of them could say."""
    total, answered = 0.0, False
    for upstream in upstreams:
        try:
            response = httpx.get(upstream.rstrip("/") + "/metrics", timeout=timeout)
            response.raise_for_status()
        except httpx.HTTPError:
            continue
        busy = busy_requests(response.text)
        if busy is not None:
            answered = True
            total += busy
    return total if answered else None


@dataclass
class TrafficYield(ReadySince):
    """Whether a step that is ready should wait for the replicas to go idle; `busy_now` says
    how many requests they hold now (None: unknown), e.g. `replicas_busy` of them."""

    busy_now: Callable[[], float | None]
    limit_seconds: float
    quiet_seconds: float = QUIET_SECONDS
    ready_since: float | None = field(default=None, init=False)
    idle_since: float | None = field(default=None, init=False)
    busy: float = field(default=0.0, init=False)  # what the replicas reported last
    _unanswered_logged: bool = field(default=False, init=False)

    def should_wait(self, now: float | None = None) -> bool:
        """True while the replicas are busy (or idle for less than quiet_seconds) and the
        step has waited less than limit_seconds; call it at each look while a step is
        ready, and `took` once it starts."""
        if self.limit_seconds <= 0:
            return False
        now = time.monotonic() if now is None else now
        if self.ready_since is None:
            self.ready_since = now
        if now - self.ready_since >= self.limit_seconds:
            return False
        busy = self.busy_now()
        if busy is None:
            # unknown is not idle: wait (within the limit) for an answer
            if not self._unanswered_logged:
                log.warning(
                    "no replica answered /metrics: a ready step waits its --yield-to-traffic "
                    "limit, or until one answers idle"
                )
                self._unanswered_logged = True
            return True
        self.busy = busy
        if busy > 0:
            self.idle_since = None
            return True
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since < self.quiet_seconds

    def reset(self) -> None:
        super().reset()
        self.idle_since = None


def yielding_to(upstreams: Sequence[str], limit_seconds: float) -> TrafficYield:
    """A TrafficYield over these vLLM replicas' /metrics."""
    return TrafficYield(lambda: replicas_busy(upstreams), limit_seconds)
