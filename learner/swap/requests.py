"""Carry out the swaps the admin API asked for through the store (store/swap_requests.py).

The admin API, inside the proxy process, only records a rollback or promote; this worker, a
thread of the running learner, claims it, serves the version with `versions.serve_version`
(under the publish lease, fenced and verified, the same code as `onthejob rollback`) and
records the outcome, which the admin API is polling for. The learner's loop then follows the
new serving version as it follows any operator's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import TypedDict

from sqlalchemy import Engine

from learner.swap import lease
from learner.swap.versions import VersionError, serve_version
from store import swap_requests


class SwapOutcome(TypedDict, total=False):
    """What `swap_requests.finish` records of a request: `serving` (done), or `error` and
    its HTTP status (failed)."""

    serving: str
    error: str
    error_status: int


log = logging.getLogger("onthejob.learner")

POLL_INTERVAL = 0.25  # s between looks at the store: an operator is waiting on the answer
FINISH_TRIES = 60  # a second apart: the admin API gives up on an answer before that


class SwapRequestWorker:
    """Claims and carries out swap requests, one at a time, from a thread of its own."""

    def __init__(
        self,
        engine: Engine,
        upstreams: Sequence[str],
        *,
        drain_timeout: float = 60.0,
        poll_interval: float = POLL_INTERVAL,
        replica_control: contextlib.AbstractContextManager[object] | None = None,
    ) -> None:
        """``replica_control``: held while a swap runs, so that it never overlaps the
        learner's time slice (learner/time_slice.py: its ``control``)."""
        self.engine = engine
        self.replica_control = replica_control or contextlib.nullcontext()
        self.upstreams = list(upstreams)
        self.drain_timeout = drain_timeout
        self.poll_interval = poll_interval
        self.holder = lease.holder_name("swap-requests")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SwapRequestWorker:
        self._thread = threading.Thread(target=self._run, name="swap-requests", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except Exception as exc:  # the store is away: look again, the loop says why
                log.debug("swap requests: %s", exc)
                busy = False
            if not busy:
                self._stop.wait(self.poll_interval)

    def run_once(self) -> bool:
        """Carry out the oldest pending request; False if there was none."""
        with self.engine.begin() as conn:
            request = swap_requests.claim_next(conn, holder=self.holder)
        if request is None:
            return False
        version, action = request["version"], request["action"]
        log.info("%s of %s asked through the admin API", action, version)
        outcome: SwapOutcome
        try:
            with self.replica_control:  # a sliced step's paused replicas resumed first
                label = serve_version(
                    self.engine,
                    self.upstreams,
                    version,
                    action=action,
                    lease_wait=request["lease_wait"],
                    drain_timeout=self.drain_timeout,
                )
            outcome = {"serving": label}
        except VersionError as exc:
            outcome = {"error": str(exc), "error_status": exc.status}
        except Exception as exc:  # recorded for the operator, never lost in a thread
            log.exception("%s of %s failed", action, version)
            outcome = {"error": f"{action} failed: {exc}", "error_status": 500}
        self._finish(request["id"], outcome)
        return True

    def _finish(self, request_id: int, outcome: SwapOutcome) -> None:
        """Record the outcome; while the store is away, try again (the swap happened)."""
        for _ in range(FINISH_TRIES):
            try:
                with self.engine.begin() as conn:
                    swap_requests.finish(conn, request_id, **outcome)
                return
            except Exception as exc:
                log.warning("swap request %d: recording its outcome failed: %s", request_id, exc)
                if self._stop.wait(1.0):
                    return
