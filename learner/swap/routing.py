"""When a tenant's new adapter answers that tenant's calls: every live proxy reports, with
its heartbeat, the tenants it sends to their serving adapter (store/gates.py), once every
replica it routes to has the adapter loaded. Its evals (the guard) wait for that, so they
are answered by the version they judge."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import Engine

from store import gates

# a proxy follows the tenants and the replicas' adapters about every second
ROUTED_WAIT = 30.0


def wait_routed(
    engine: Engine, tenant: str, version: str, *, timeout: float = ROUTED_WAIT
) -> float | None:
    """Seconds until every live proxy sends `tenant`'s calls to `version`; None: not within
    `timeout` (a proxy that cannot see the replicas, or runs an older onthejob)."""
    start = time.monotonic()
    while True:
        with engine.connect() as conn:
            if gates.routed_everywhere(conn, tenant=tenant, version=version, now=datetime.now(UTC)):
                return time.monotonic() - start
        if time.monotonic() - start >= timeout:
            return None
        time.sleep(0.1)
