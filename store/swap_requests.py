"""Swap requests: the admin API asks for a rollback or promote, a running learner carries it
out (learner/swap/requests.py). Callers own the transaction.

A request goes pending -> running -> done | failed, or pending -> abandoned when nobody
claims it in time (`abandon`): a claimed request is always finished by its claimer, and an
abandoned one is never claimed, so an operator who was told "no learner" has no swap
happening behind their back.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection, insert, select, update

from store.clock import now
from store.models import SwapRequest


class SwapRequestRow(TypedDict):
    """An operator's request to serve a version again, and how it went."""

    id: int
    version: str
    action: str  # rollback | promote
    lease_wait: float
    status: str
    requested_at: datetime
    claimed_by: str | None
    claimed_at: datetime | None
    finished_at: datetime | None
    serving: str | None  # the label it serves as, once done
    error: str | None
    error_status: int | None  # the HTTP status of a failure


PENDING, RUNNING, DONE, FAILED, ABANDONED = "pending", "running", "done", "failed", "abandoned"


def request(conn: Connection, *, version: str, action: str, lease_wait: float) -> int:
    """Record a request; its id."""
    result = conn.execute(
        insert(SwapRequest).values(
            version=version,
            action=action,
            lease_wait=lease_wait,
            status=PENDING,
            requested_at=now(),
        )
    )
    return int(result.inserted_primary_key[0])


def claim_next(conn: Connection, *, holder: str) -> SwapRequestRow | None:
    """The oldest pending request, now running under `holder`; None if there is none."""
    pending = conn.execute(
        select(SwapRequest.id).where(SwapRequest.status == PENDING).order_by(SwapRequest.id)
    ).scalars()
    for request_id in pending.all():
        claimed = conn.execute(
            update(SwapRequest)
            .where(SwapRequest.id == request_id, SwapRequest.status == PENDING)
            .values(status=RUNNING, claimed_by=holder, claimed_at=now())
        )
        if claimed.rowcount == 1:  # else another learner, or an abandon, came first
            return get(conn, request_id)
    return None


def finish(
    conn: Connection,
    request_id: int,
    *,
    serving: str | None = None,
    error: str | None = None,
    error_status: int | None = None,
) -> None:
    """Record the outcome: `serving` (done) or `error` with its HTTP status (failed)."""
    conn.execute(
        update(SwapRequest)
        .where(SwapRequest.id == request_id)
        .values(
            status=FAILED if error is not None else DONE,
            finished_at=now(),
            serving=serving,
            error=error,
            error_status=error_status,
        )
    )


def abandon(conn: Connection, request_id: int) -> bool:
    """Give up on a request nobody claimed; False if a learner claimed it meanwhile."""
    result = conn.execute(
        update(SwapRequest)
        .where(SwapRequest.id == request_id, SwapRequest.status == PENDING)
        .values(status=ABANDONED, finished_at=now())
    )
    return result.rowcount == 1


def get(conn: Connection, request_id: int) -> SwapRequestRow | None:
    row = conn.execute(select(SwapRequest.__table__).where(SwapRequest.id == request_id)).first()
    return None if row is None else cast(SwapRequestRow, dict(row._mapping))
