"""Ask a running learner to serve a recorded version again, through the store, and wait for
its answer (store/swap_requests.py; learner/swap/requests.py carries it out). The proxy
process holds no swap code: it checks what it can answer at once (unknown version, nothing
to serve), records the request and polls for the outcome.
"""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import Engine

from proxy.admin.errors import AdminError
from store import policy_versions, swap_requests
from store.swap_requests import SwapRequestRow

# A publish holds the lease while its replicas drain (up to gate_wait) and then swaps and
# verifies: an operator's rollback queues behind it that long rather than failing with 409
# because a long stream was still draining (seen on a loaded machine after a fixed 10 s).
SWAP_ALLOWANCE = 30.0
# a running learner looks for requests every 0.25 s, from a thread of its own (a long step
# does not delay it): one that has not claimed the request by then is not running
CLAIM_WAIT = 10.0
# the swap itself once the lease is held: reload, weight check and probe on every replica
SWAP_WAIT = 300.0
POLL = 0.1

NO_LEARNER = (
    "no learner is running to carry out the {action} (the learner does every swap): start "
    "`onthejob learn`, or run `onthejob rollback {version}`, which loads nothing but the store"
)


async def serve_again(engine: Engine, version: str, action: str, gate_wait: float) -> str:
    """Serve `version` again (action "rollback" or "promote"); the new version's name.
    AdminError: 404/409 refused, 502 the verified swap failed (the previous weights keep
    serving), 503 no learner claimed it, 504 it is still running."""
    lease_wait = gate_wait + SWAP_ALLOWANCE
    request_id = await asyncio.to_thread(_check_and_request, engine, version, action, lease_wait)
    claim_by = time.monotonic() + CLAIM_WAIT
    answer_by = claim_by + lease_wait + SWAP_WAIT
    while True:
        request = await asyncio.to_thread(_read, engine, request_id)
        if request["status"] == swap_requests.DONE:
            return str(request["serving"])
        if request["status"] == swap_requests.FAILED:
            raise AdminError(int(request["error_status"] or 500), str(request["error"]))
        now = time.monotonic()
        if request["status"] == swap_requests.PENDING and now > claim_by:
            if await asyncio.to_thread(_abandon, engine, request_id):
                raise AdminError(503, NO_LEARNER.format(action=action, version=version))
            continue  # claimed meanwhile
        if now > answer_by:
            raise AdminError(
                504,
                f"the {action} to {version!r} is still running (swap request {request_id}); "
                "GET /admin/api/versions shows what serves once it is done",
            )
        await asyncio.sleep(POLL)


def _check_and_request(engine: Engine, version: str, action: str, lease_wait: float) -> int:
    with engine.begin() as conn:
        target = policy_versions.version(conn, version=version)
        current = policy_versions.serving_version(conn)
        try:
            policy_versions.check_servable(target, current, version, action)
        except policy_versions.VersionError as exc:
            raise AdminError(exc.status, str(exc)) from None
        return swap_requests.request(conn, version=version, action=action, lease_wait=lease_wait)


def _read(engine: Engine, request_id: int) -> SwapRequestRow:
    with engine.connect() as conn:
        request = swap_requests.get(conn, request_id)
    assert request is not None
    return request


def _abandon(engine: Engine, request_id: int) -> bool:
    with engine.begin() as conn:
        return swap_requests.abandon(conn, request_id)
