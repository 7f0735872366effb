"""The publisher's side of the swap gates: keep every proxy off replicas while their weights
change, and let them back once the weights are verified (store/gates.py).

Invariant: `close` returns only when every live proxy that routes to one of the replicas has
acknowledged the new gate epoch with nothing in flight to it; from then until `open`, the
only requests those replicas see are the publisher's own (reload, probe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine

from store import gates

log = logging.getLogger("onthejob.learner")


class FenceError(Exception):
    """The replicas could not be fenced off (a proxy still sends to them, or is misconfigured)."""


class Fence:
    """``abort_stragglers(upstreams)``: called once if the drain takes longer than
    ``drain_timeout``; it aborts what the replicas still run (those calls end with an error for
    their clients), so a swap waits for long generations only that long. Their proxies then
    have ``abort_grace`` seconds to see them end."""

    def __init__(
        self,
        engine: Engine,
        holder: str,
        *,
        drain_timeout: float = 60.0,
        abort_grace: float = 10.0,
        poll: float = 0.05,
    ) -> None:
        self.engine = engine
        self.holder = holder
        self.drain_timeout = drain_timeout
        self.abort_grace = abort_grace
        self.poll = poll

    def close(
        self,
        upstreams: Sequence[str],
        *,
        abort_stragglers: Callable[[Sequence[str]], None] | None = None,
        known: Sequence[str] | None = None,
    ) -> None:
        """Fence `upstreams` off. `known`: every replica the publisher has (default: those
        fenced), where it fences some of them (a canary's candidate): a proxy that routes to
        any other is misconfigured."""
        with self.engine.begin() as conn:
            now = datetime.now(UTC)
            epochs = {
                u: gates.close_gate(conn, upstream=u, holder=self.holder, now=now)
                for u in upstreams
            }
        every = set(upstreams if known is None else known) | set(upstreams)
        try:
            if not self._drained(epochs, every, self.drain_timeout):
                if abort_stragglers is None:
                    raise FenceError(self._waiting_message(epochs, every, self.drain_timeout))
                log.warning(
                    "replicas not drained after %gs: aborting their remaining requests",
                    self.drain_timeout,
                )
                abort_stragglers(list(upstreams))
                if not self._drained(epochs, every, self.abort_grace):
                    waited = self.drain_timeout + self.abort_grace
                    raise FenceError(self._waiting_message(epochs, every, waited))
        except BaseException:
            self.open(upstreams, None)  # nothing was touched: let traffic through again
            raise

    def open(self, upstreams: Sequence[str], version: str | None) -> None:
        """`version`: what the replicas serve now (None: unchanged)."""
        with self.engine.begin() as conn:
            now = datetime.now(UTC)
            for upstream in upstreams:
                label = _current_label(conn, upstream) if version is None else version
                gates.open_gate(conn, upstream=upstream, version=label, now=now)

    def _drained(self, epochs: dict[str, int], known: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self.engine.connect() as conn:
                waiting = _unacknowledged(conn, epochs, known)
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll)

    def _waiting_message(self, epochs: dict[str, int], known: set[str], waited: float) -> str:
        with self.engine.connect() as conn:
            waiting = _unacknowledged(conn, epochs, known)
        return (
            f"replicas not drained after {waited:g}s: proxies {', '.join(sorted(waiting))} still "
            "have requests in flight to them"
        )


def _unacknowledged(conn: Connection, epochs: dict[str, int], known: set[str]) -> set[str]:
    """Live proxies that route to a fenced replica and have not acknowledged its epoch.

    A live proxy routing to a replica the publisher does not know (another name for the same
    vLLM, say) could be sending it traffic the fence cannot see: that is refused outright.
    """
    waiting: set[str] = set()
    for proxy in gates.live_instances(conn, now=datetime.now(UTC)):
        routes = set(proxy["upstreams"] or [])
        unknown = routes - known
        if unknown:
            raise FenceError(
                f"proxy {proxy['host']} routes to {', '.join(sorted(unknown))}, which this "
                f"publisher does not publish to ({', '.join(sorted(known))}): give the "
                "proxies and the learner the same --upstream list"
            )
        acks = proxy["acks"] or {}
        if any(int(acks.get(u, 0)) < epochs[u] for u in routes & set(epochs)):
            waiting.add(str(proxy["host"]))
    return waiting


def _current_label(conn: Connection, upstream: str) -> str | None:
    gate = gates.read_gates(conn).get(upstream)
    return None if gate is None else gate["version"]
