"""The running canaries, decided by the learner (learner/canary/decide.py).

A canary is started by an operator (the admin API), or by the learner for each new version
of a scope its canary settings give a share (learner/canary/starts.py), with its share,
minimum and time limit; while it runs, every proxy splits its scope's sessions between the
candidate and the incumbent. After each grading pass (at most every `LOOK_EVERY` seconds)
the learner reads each arm's stats from the store and rolls the candidate back where it is
worse on any measure, promotes it where its reward is better and nothing is worse, or takes
the default decision at the time limit. Each decision is recorded as the learner's, with
its reason.

A tenant's candidate is promoted here: the tenant's adapter pointer moves to it. The shared
policy's candidate needs every replica swapped: given the replicas, the learner serves it
on each (learner/swap/versions.py, as the admin API's promote does: VERSION+rollback-N),
then records the promotion; without them, or where the swap fails, it says once that an
operator can (POST /admin/api/canaries/{id}/promote). A rollback changes nothing that
serves, in either scope; a full-weight candidate's replicas then serve the incumbent again
(learner/loop/step.py, at the learner's next look).

The reward-hacking watch (learner/canary/watch.py) reads each running canary's arms
(store/watch_windows.py) every `WATCH_EVERY` seconds, and again before a decision its alerts
could change, at the thresholds of the canary's tenant where it sets its own
(learner/canary/settings.py), and records its alerts (store/watch_alerts.py): while any
detector alerts, a promotion is held (recorded as a `hold` action with the alerts, once per
change) and, at the time limit, becomes a rollback (learner/canary/decide.py). Where no
canary runs for the shared policy, its newest version is watched against the one before, every
`WATCH_NEWEST_EVERY` seconds; those alerts hold nothing. A raised or cleared alert is logged
and goes to the trackers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Connection, Engine

from learner.canary.decide import Decision, decide
from learner.canary.settings import watch_thresholds
from learner.canary.starts import BY
from learner.canary.watch import Alert, Thresholds
from learner.canary.windows import alerts_of
from learner.loop.state import LEASE_WAIT
from learner.swap.versions import VersionError, serve_version
from learner.trackers import Reporter
from store import canaries as store
from store import clock, tenants, watch_alerts, watch_windows
from store.canary_stats import arm_stats

log = logging.getLogger("onthejob.learner")

LOOK_EVERY = 10.0  # seconds between looks at the running canaries
WATCH_EVERY = 60.0  # seconds between the watch's reads of a canary's arms
WATCH_NEWEST_EVERY = 60.0  # seconds between looks at the newest version without a canary


class Canaries:
    """Decide the running canaries from their arms' stats."""

    def __init__(
        self,
        engine: Engine,
        reporter: Reporter | None = None,
        step: Callable[[], int] = lambda: 0,
        *,
        upstreams: Sequence[str] = (),
        drain_timeout: float = 60.0,
    ) -> None:
        """`reporter`, `step`: the trackers the watch's alerts go to, at the learner's step.
        `upstreams`: the replicas a shared policy's candidate is swapped into when promoted
        (none: an operator promotes it)."""
        self.engine = engine
        self.reporter = reporter
        self.step = step
        self.upstreams = list(upstreams)
        self.drain_timeout = drain_timeout
        self.last_look = float("-inf")
        self.last_newest = float("-inf")
        self.told: set[int] = set()  # shared canaries whose promotion was left to an operator
        self.watched: dict[int, tuple[float, list[Alert]]] = {}  # per canary: when, what

    def decide_running(self) -> int:
        """Look at every running canary (at most every LOOK_EVERY s); how many were decided."""
        if time.monotonic() - self.last_look < LOOK_EVERY:
            return 0
        self.last_look = time.monotonic()
        with self.engine.connect() as conn:
            running = store.list_canaries(conn, status=store.RUNNING)
        decided = sum(self._look(canary) for canary in running)
        if not any(c["tenant"] is None for c in running):
            self._watch_newest()
        return decided

    def _look(self, canary: store.CanaryRow) -> bool:
        """Decide one canary from its arms and the watch's alerts; whether it was decided."""
        now = clock.now()
        with self.engine.connect() as conn:
            arms = arm_stats(conn, canary, now=now)
        alerts, fresh = self._canary_alerts(canary, now, force=False)
        decision = decide(canary, arms, now=now, alerts=alerts)
        ending = decision is not None and (
            decision.action == "promote" or (bool(alerts) and now >= canary["ends_at"])
        )
        if ending and not fresh:
            # nothing is promoted, or rolled back for the watch, on what it said a minute ago
            alerts, _ = self._canary_alerts(canary, now, force=True)
            decision = decide(canary, arms, now=now, alerts=alerts)
        if decision is None:
            return False
        if decision.action == "hold":
            self._hold(canary, decision, alerts, now)
            return False
        if decision.action == "promote" and canary["tenant"] is None:
            if not self._serve_shared(canary, decision.reason):
                return False
        act = store.promote if decision.action == "promote" else store.roll_back
        try:
            with self.engine.begin() as conn:
                act(conn, canary_id=canary["id"], by=BY, reason=decision.reason, now=now)
        except store.CanaryError as exc:  # decided meanwhile by an operator, or gone
            log.info("canary %s: not decided by the learner: %s", canary["id"], exc)
            return False
        scope = canary["tenant"] or "the shared policy"
        log.info(
            "canary %s (%s, %s against %s): %s: %s",
            *(canary["id"], scope, canary["candidate"], canary["incumbent"]),
            *("promoted" if decision.action == "promote" else "rolled back", decision.reason),
        )
        return True

    def _canary_alerts(
        self, canary: store.CanaryRow, now: datetime, *, force: bool
    ) -> tuple[list[Alert], bool]:
        """The watch's alerts on the canary's candidate, and whether they were read now: at
        most every WATCH_EVERY s (it reads every call of up to 2 x 1,000 trajectories), or
        `force`; in between, what the last read found."""
        last = self.watched.get(canary["id"])
        if not force and last is not None and time.monotonic() - last[0] < WATCH_EVERY:
            return last[1], False
        with self.engine.connect() as conn:
            windows = watch_windows.canary_windows(
                conn,
                canary_id=canary["id"],
                tenant=canary["tenant"],
                candidate=canary["candidate"],
                incumbent=canary["incumbent"],
                since=canary["started_at"],
                until=now,
            )
            limits = self._thresholds(conn, canary["tenant"])
        alerts = self._watch(windows, now, limits)
        self.watched[canary["id"]] = (time.monotonic(), alerts)
        return alerts, True

    @staticmethod
    def _thresholds(conn: Connection, tenant: str | None) -> Thresholds | None:
        """The watch's thresholds on a canary of the scope: its tenant's, where it sets any."""
        overrides = None if tenant is None else tenants.canary_overrides(conn, tenant)
        return None if overrides is None else watch_thresholds(overrides)

    def _watch(
        self, windows: watch_windows.WatchWindows, now: datetime, limits: Thresholds | None = None
    ) -> list[Alert]:
        """The watch's alerts on `windows` (at `limits`, else the code's), recorded; a raised
        or cleared one logged and sent to the trackers."""
        alerts = alerts_of(windows, limits)
        found = [watch_alerts.Found(a.detector, a.reason) for a in alerts]
        with self.engine.begin() as conn:
            changes = watch_alerts.record(
                conn,
                scope=windows.scope,
                version=windows.version,
                baseline=windows.baseline,
                canary_id=windows.canary_id,
                found=found,
                now=now,
            )
            active = watch_alerts.counts(conn) if changes.raised or changes.cleared else None
        what = _watched(windows)
        for raised in changes.raised:
            log.warning("watch: %s: %s: %s", what, raised.detector, raised.reason)
        for detector in changes.cleared:
            log.info("watch: %s: %s no longer alerts", what, detector)
        if active is not None:
            self._report({d: c.active for d, c in active.items()}, {})
        return alerts

    def _watch_newest(self) -> None:
        if time.monotonic() - self.last_newest < WATCH_NEWEST_EVERY:
            return
        self.last_newest = time.monotonic()
        now = clock.now()
        with self.engine.connect() as conn:
            windows = watch_windows.newest_windows(conn, now=now)
        if windows is not None:
            self._watch(windows, now)

    def _hold(
        self, canary: store.CanaryRow, decision: Decision, alerts: Sequence[Alert], now: datetime
    ) -> None:
        """The promotion the watch holds: recorded as the canary's `hold` once per change."""
        found = [watch_alerts.Found(a.detector, a.reason) for a in alerts]
        with self.engine.begin() as conn:
            recorded = watch_alerts.hold(
                conn, canary_id=canary["id"], by=BY, reason=decision.reason, found=found, now=now
            )
        if recorded:
            log.warning("canary %s: promotion held: %s", canary["id"], decision.reason)
            self._report({}, {canary["id"]: True})

    def _report(self, active: dict[str, int], held: dict[int, bool]) -> None:
        if self.reporter is not None:
            self.reporter.watch(self.step(), active, held)

    def _serve_shared(self, canary: store.CanaryRow, reason: str) -> bool:
        """The shared policy's candidate served on every replica, verified against its
        recorded probe, before its promotion is recorded; False: left to an operator (no
        replicas given, or the swap failed once: not tried again at every look)."""
        if not self.upstreams or canary["id"] in self.told:
            self._leave_to_operator(canary["id"], reason, "the learner was given no replicas")
            return False
        try:
            served = serve_version(
                self.engine,
                self.upstreams,
                canary["candidate"],
                action="promote",
                lease_wait=LEASE_WAIT,
                drain_timeout=self.drain_timeout,
            )
        except VersionError as exc:
            self._leave_to_operator(canary["id"], reason, f"the learner's swap failed: {exc}")
            return False
        log.info(
            "canary %s: the shared policy's candidate %s serves every replica as %s",
            canary["id"],
            canary["candidate"],
            served,
        )
        return True

    def _leave_to_operator(self, canary_id: int, reason: str, why: str) -> None:
        if canary_id in self.told:
            return
        self.told.add(canary_id)
        log.warning(
            "canary %s: %s; the shared policy's candidate is served by a swap of every "
            "replica, and %s: an operator can promote it (POST /admin/api/canaries/%s/promote)",
            canary_id,
            reason,
            why,
            canary_id,
        )


def _watched(windows: watch_windows.WatchWindows) -> str:
    scope = "the shared policy" if windows.scope == store.SHARED else f"tenant {windows.scope}"
    of = f"canary {windows.canary_id}" if windows.canary_id is not None else "newest version"
    against = windows.baseline or "the other versions"
    return f"{of} ({scope}, {windows.version} against {against})"
