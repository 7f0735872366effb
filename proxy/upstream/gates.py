"""The proxy's side of the swap gates: follow them from the store, acknowledge drained ones.

A publisher (the learner, a rollback) closes a replica's gate before it touches the
replica's weights and opens it only once they are verified (store/gates.py). This
proxy then sends the replica nothing, and acknowledges the gate's epoch once its last
request to the replica has ended, so the publisher knows that no client of this proxy can
be answered by weights that have not passed verification.

Invariant: the proxy registers itself before it first reads the gates, and reads them
before it serves (`start`), so it never misses a gate closed while it was starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from proxy.upstream.replicas import UpstreamPool
from store import gates

log = logging.getLogger("onthejob.gates")

# how often a proxy reports that it is alive (well within gates.PROXY_TTL)
REPORT_EVERY = 2.0


class GateKeeper:
    def __init__(
        self,
        engine: Engine,
        pool: UpstreamPool,
        *,
        poll_interval: float,
        routes: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.poll_interval = poll_interval
        # the tenants sent to their adapters (proxy/upstream/tenants.py): reported at once
        # when they change, so a learner knows when a tenant's new adapter answers it
        self.routes = routes
        self._routed: dict[str, str] = {}
        self.instance_id = os.urandom(16).hex()
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self._acked: dict[str, int] = {}
        self._reported = 0.0

    async def start(self) -> None:
        """One sync before the first request; a store that is away does not stop start-up
        (the gates are followed as soon as it answers)."""
        try:
            await self.sync()
        except SQLAlchemyError as exc:
            log.warning("swap gates unreadable at start (%s); following them once it answers", exc)

    async def run(self) -> None:
        """Forever: follow the gates; acknowledge at once when a gated replica drains."""
        while True:
            try:
                await self.sync()
            except SQLAlchemyError:
                # the store is away: keep what we know; the publisher cannot close gates now
                log.debug("swap gate sync failed", exc_info=True)
            waiting_for_drain = any(r.gate_epoch is not None for r in self.pool.replicas)
            interval = self.poll_interval / 4 if waiting_for_drain else self.poll_interval
            self.pool.drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pool.drained.wait(), timeout=interval)

    async def stop(self) -> None:
        with contextlib.suppress(SQLAlchemyError):
            await asyncio.to_thread(self._forget)

    async def sync(self) -> None:
        # report first (alive, what is acknowledged), then read: see the module's invariant
        if time.monotonic() - self._reported >= REPORT_EVERY:
            await asyncio.to_thread(self._register)
        state = await asyncio.to_thread(self._read)
        for replica in self.pool.replicas:
            gate = state.get(replica.url)
            if gate is not None and gate["closed"]:
                self.pool.close_gate(replica, int(gate["epoch"]))
            else:
                self.pool.open_gate(replica, None if gate is None else gate["version"])
        drained = self.pool.drained_epochs()
        routed = self.routes()
        if routed != self._routed or any(
            self._acked.get(url) != epoch for url, epoch in drained.items()
        ):
            self._acked.update(drained)
            self._routed = routed
            await asyncio.to_thread(self._register)

    def _register(self) -> None:
        self._reported = time.monotonic()
        with self.engine.begin() as conn:
            gates.register(
                conn,
                instance_id=self.instance_id,
                host=self.host,
                upstreams=[r.url for r in self.pool.replicas],
                acks=self._acked,
                now=datetime.now(UTC),
                routes=self._routed,
            )

    def _read(self) -> dict[str, dict]:
        with self.engine.connect() as conn:
            return gates.read_gates(conn)

    def _forget(self) -> None:
        with self.engine.begin() as conn:
            gates.forget(conn, instance_id=self.instance_id)
