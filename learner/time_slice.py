"""The trainer takes the cores in turn with the vLLM-CPU replicas on its host.

Beside a replica that serves continuous traffic on the same cores, a CPU trainer computes
only part of the time: on 2 cores, one trainer thread beside vLLM serving 8 clients computed
26-45% of a step's wall time, and a step of Gemma 3 270M took 50-115 s (issue 42;
docs/measurements/defaults.md). Taking turns instead, the learner pauses the replicas on
its host (vLLM's /pause, mode "keep": what runs is frozen and goes on after, nothing is
dropped; new requests wait), computes the step on every core, and resumes them. The clients
see the step's compute time as latency once a step; the step is done in a fraction of the
time. Replicas on other hosts, and a trainer on a GPU, are left alone.

A replica left paused would answer no one: resuming is retried; before the first pause a
guard process starts beside the learner and resumes the replicas once the learner is gone,
however it ended (learner/resume_guard.py); a learner's start resumes them too; a replica
that cannot be paused (no dev mode, an old vLLM) is said once and trained beside.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import torch

from learner.threads import is_this_host

log = logging.getLogger("onthejob.learner")

RESUME_ATTEMPTS = 8  # 0.25 s doubling to 4 s between them: about half a minute in all


@dataclass
class TimeSlice:
    """Pauses ``replicas`` (base URLs on this host) while the trainer computes on
    ``threads`` threads; empty ``replicas``: the trainer computes beside them, as it is."""

    replicas: list[str]
    threads: int
    timeout: float = 10.0
    unpausable: set[str] = field(default_factory=set)  # said once, then trained beside
    guard: subprocess.Popen[bytes] | None = None  # learner/resume_guard.py, once started

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
            f"step on {self.threads} threads (--time-slice off: compute beside them)"
        )

    @contextmanager
    def training(self) -> Iterator[list[str]]:
        """Pause the replicas, hand torch the cores, and give both back after; yields the
        replicas it paused."""
        paused: list[str] = []
        if not self.active:
            yield paused
            return
        self._guarded()
        threads_before = torch.get_num_threads()
        with httpx.Client(timeout=self.timeout, headers={"Connection": "close"}) as client:
            for upstream in self.replicas:
                if upstream not in self.unpausable and self._pause(client, upstream):
                    paused.append(upstream)
            if paused:
                torch.set_num_threads(self.threads)
            try:
                yield paused
            finally:
                torch.set_num_threads(threads_before)
                for upstream in paused:
                    resume(client, upstream)

    def _guarded(self) -> None:
        """The guard that resumes the replicas when this process is gone, started once (and
        again, should it have died)."""
        if self.guard is not None and self.guard.poll() is None:
            return
        self.guard = subprocess.Popen(
            [sys.executable, "-m", "learner.resume_guard", *self.replicas],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a signal to the learner's process group spares it
        )

    def close(self) -> None:
        """A clean stop: the guard resumes the replicas (nothing is paused now) and exits."""
        guard, self.guard = self.guard, None
        if guard is not None:
            assert guard.stdin is not None
            guard.stdin.close()
            try:
                guard.wait(timeout=30)
            except subprocess.TimeoutExpired:
                guard.kill()
                guard.wait()

    def _pause(self, client: httpx.Client, upstream: str) -> bool:
        try:
            client.post(upstream + "/pause", params={"mode": "keep"}).raise_for_status()
            return True
        except httpx.HTTPStatusError as exc:  # it answered: no dev mode, or too old a vLLM
            self.unpausable.add(upstream)
            log.warning(
                "time slice: %s cannot be paused (%s); the trainer computes beside it "
                "(vLLM needs VLLM_SERVER_DEV_MODE=1)",
                upstream,
                _said(exc),
            )
        except httpx.TransportError as exc:  # away for now: nothing of it to take turns with
            log.debug("time slice: %s not paused (%s)", upstream, _said(exc))
        return False


def resume(client: httpx.Client, upstream: str, attempts: int = RESUME_ATTEMPTS) -> bool:
    """Resume a replica, retried: False (said at error level) only when it never answered."""
    for attempt in range(attempts):
        try:
            client.post(upstream + "/resume").raise_for_status()
            return True
        except httpx.HTTPError as exc:
            if attempt == attempts - 1:
                log.error(
                    "time slice: %s did not resume (%s): it may serve no one until resumed "
                    "(POST %s/resume)",
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
    with httpx.Client(timeout=slice_.timeout, headers={"Connection": "close"}) as client:
        for upstream in slice_.replicas:
            try:  # not up yet, or no dev mode: nothing of ours can be paused there
                client.post(upstream + "/resume")
            except httpx.HTTPError:
                pass


def _said(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{exc.response.status_code} {exc.response.text[:120]}"
    return type(exc).__name__
