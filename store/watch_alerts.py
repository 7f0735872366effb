"""The reward-hacking watch's alerts, kept (learner/canary/watch.py finds them; the learner
records them here at each look; the admin API, /metrics and the dashboard read them).

An alert is one detector alerting on a version against the one it is compared with: a
canary's candidate against its incumbent, or (no canary) the shared policy's newest version
against the one before. It is raised by the first look that finds it, kept while the looks
find it (`seen_at`, its reason as the last look said it) and cleared by the first that does
not. An alert counts as active while it is open and its canary (if any) still runs.

A canary whose promotion the watch holds gets a `hold` action (store/canaries.py's actions
table, by the learner) when the hold begins or its detectors change: not at every look.
Callers own the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, RowMapping, func, insert, or_, select, update

from store.canaries import RUNNING
from store.clock import as_utc
from store.models import Canary, CanaryAction, WatchAlert

# every detector's name (learner/canary/watch.py's Alert.detector), for a gauge per detector
DETECTORS = (
    "reward up, complaints up",
    "reply length collapsing",
    "reply length exploding",
    "refusals",
    "clarifying questions",
    "tool calls that fail to parse",
    "self-judge disagreeing with the grader",
    "one key's feedback dominating",
)
HOLD = "hold"


@dataclass(frozen=True)
class Found:
    """What one detector says now."""

    detector: str
    reason: str


@dataclass(frozen=True)
class Changes:
    raised: list[Found]
    cleared: list[str]  # detectors


@dataclass(frozen=True)
class StoredAlert:
    id: int
    canary_id: int | None
    scope: str
    version: str
    baseline: str | None
    detector: str
    reason: str
    raised_at: datetime
    seen_at: datetime
    cleared_at: datetime | None


@dataclass(frozen=True)
class DetectorCount:
    active: int  # alerting now
    raised: int  # ever raised


def record(
    conn: Connection,
    *,
    scope: str,
    version: str,
    baseline: str | None,
    canary_id: int | None,
    found: Sequence[Found],
    now: datetime,
) -> Changes:
    """One look's findings for a canary (or, canary_id None, a scope's newest version):
    raise what is new, move on what is still found, clear the rest (another version's
    included: the newest version changed)."""
    w = WatchAlert
    watched = w.canary_id == canary_id if canary_id is not None else w.canary_id.is_(None)
    open_rows = conn.execute(
        select(w.id, w.version, w.detector).where(watched, w.scope == scope, w.cleared_at.is_(None))
    ).all()
    by_detector = {f.detector: f for f in found}
    kept = {
        detector: row_id
        for row_id, row_version, detector in open_rows
        if row_version == version and detector in by_detector
    }
    cleared = [
        (row_id, detector) for row_id, _, detector in open_rows if row_id not in kept.values()
    ]
    if cleared:
        conn.execute(
            update(w).where(w.id.in_([row_id for row_id, _ in cleared])).values(cleared_at=now)
        )
    for detector, row_id in kept.items():
        reason = by_detector[detector].reason
        conn.execute(update(w).where(w.id == row_id).values(seen_at=now, reason=reason))
    raised = [f for f in found if f.detector not in kept]
    if raised:
        conn.execute(
            insert(w),
            [
                {
                    "canary_id": canary_id, "scope": scope, "version": version,
                    "baseline": baseline, "detector": f.detector, "reason": f.reason,
                    "raised_at": now, "seen_at": now, "cleared_at": None,
                }
                for f in raised
            ],
        )  # fmt: skip
    return Changes(raised, [detector for _, detector in cleared])


def hold(
    conn: Connection,
    *,
    canary_id: int,
    by: str,
    reason: str,
    found: Sequence[Found],
    now: datetime,
) -> bool:
    """Record that the watch holds the canary's promotion, unless its last action is a hold
    by the same detectors already; whether it was recorded."""
    detectors = sorted(f.detector for f in found)
    last = conn.execute(
        select(CanaryAction.action, CanaryAction.detail)
        .where(CanaryAction.canary_id == canary_id)
        .order_by(CanaryAction.id.desc())
        .limit(1)
    ).first()
    if (
        last is not None
        and last.action == HOLD
        and (last.detail or {}).get("detectors") == detectors
    ):
        return False
    alerts = [{"detector": f.detector, "reason": f.reason} for f in found]
    conn.execute(
        insert(CanaryAction).values(
            canary_id=canary_id, action=HOLD, by=by, reason=reason, at=now,
            detail={"detectors": detectors, "alerts": alerts},
        )
    )  # fmt: skip
    return True


def _active() -> ColumnElement[bool]:
    """Open, and its canary (if any) still running."""
    running = select(Canary.id).where(Canary.status == RUNNING)
    return (WatchAlert.cleared_at.is_(None)) & or_(
        WatchAlert.canary_id.is_(None), WatchAlert.canary_id.in_(running)
    )


def active(conn: Connection) -> list[StoredAlert]:
    """What alerts now, the newest raised first."""
    rows = conn.execute(
        select(WatchAlert.__table__).where(_active()).order_by(WatchAlert.id.desc())
    )
    return [_alert(row._mapping) for row in rows]


def of_canaries(conn: Connection, ids: Sequence[int]) -> dict[int, list[StoredAlert]]:
    """Each canary's alerts, cleared ones included, the newest raised first."""
    found: dict[int, list[StoredAlert]] = {}
    if not ids:
        return found
    rows = conn.execute(
        select(WatchAlert.__table__)
        .where(WatchAlert.canary_id.in_(list(ids)))
        .order_by(WatchAlert.id.desc())
    )
    for row in rows:
        alert = _alert(row._mapping)
        assert alert.canary_id is not None
        found.setdefault(alert.canary_id, []).append(alert)
    return found


def counts(conn: Connection) -> dict[str, DetectorCount]:
    """Per detector (every one of DETECTORS, and any other stored): active and ever raised."""
    raised = dict(
        conn.execute(select(WatchAlert.detector, func.count()).group_by(WatchAlert.detector)).all()
    )
    now = dict(
        conn.execute(
            select(WatchAlert.detector, func.count()).where(_active()).group_by(WatchAlert.detector)
        ).all()
    )
    names = [*DETECTORS, *sorted(set(raised) - set(DETECTORS))]
    return {name: DetectorCount(int(now.get(name, 0)), int(raised.get(name, 0))) for name in names}


def _alert(row: RowMapping) -> StoredAlert:
    values = dict(row)
    for key in ("raised_at", "seen_at", "cleared_at"):
        values[key] = as_utc(values[key])
    return StoredAlert(**values)
