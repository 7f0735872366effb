"""The reward-hacking watch's alerts (store/watch_alerts.py): what the learner's detectors
(learner/canary/watch.py) found on a canary's candidate against its incumbent, or on the
shared policy's newest version against the one before. An alert on a running canary holds
its promotion (the canary's actions show each hold, with its alerts)."""

from __future__ import annotations

from fastapi import APIRouter
from typing_extensions import TypedDict

from proxy.admin.deps import EngineDep
from store import watch_alerts
from store.canaries import tenant_of
from store.clock import iso

router = APIRouter(tags=["canaries"])


class AlertView(TypedDict):
    id: int
    canary_id: int | None  # None: the newest version against the one before, no canary
    tenant: str | None  # None: the shared policy
    version: str  # under watch
    baseline: str | None  # compared with (None: every other version)
    detector: str
    reason: str
    raised_at: str | None
    seen_at: str | None
    cleared_at: str | None  # None: it alerts still


class DetectorView(TypedDict):
    detector: str
    active: int
    raised: int


class WatchView(TypedDict):
    active: list[AlertView]
    detectors: list[DetectorView]


def alert_view(alert: watch_alerts.StoredAlert) -> AlertView:
    return {
        "id": alert.id,
        "canary_id": alert.canary_id,
        "tenant": tenant_of(alert.scope),
        "version": alert.version,
        "baseline": alert.baseline,
        "detector": alert.detector,
        "reason": alert.reason,
        "raised_at": iso(alert.raised_at),
        "seen_at": iso(alert.seen_at),
        "cleared_at": iso(alert.cleared_at),
    }


@router.get("/watch", summary="The reward-hacking watch: what alerts now, per detector")
def watch(engine: EngineDep) -> WatchView:
    """`active`: the open alerts (a running canary's, or the newest version's), newest
    first; `detectors`: per detector, how many alert now and how many were ever raised."""
    with engine.connect() as conn:
        active = watch_alerts.active(conn)
        counts = watch_alerts.counts(conn)
    return {
        "active": [alert_view(a) for a in active],
        "detectors": [
            {"detector": name, "active": c.active, "raised": c.raised} for name, c in counts.items()
        ],
    }
