"""The running canaries, decided by the learner (learner/canary/decide.py).

A canary is started by an operator (the admin API) with its share, minimum and time limit;
while it runs, every proxy splits its scope's sessions between the candidate and the
incumbent. After each grading pass (at most every `LOOK_EVERY` seconds) the learner reads
each arm's stats from the store and rolls the candidate back where it is worse on any
measure, promotes it where its reward is better and nothing is worse, or takes the default
decision at the time limit. Each decision is recorded as the learner's, with its reason.

A tenant's candidate is promoted here: the tenant's adapter pointer moves to it. The shared
policy's candidate needs every replica swapped: the learner does not do that from a canary
yet, and says once that an operator can (POST /admin/api/canaries/{id}/promote). A rollback
changes nothing that serves, in either scope.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine

from learner.canary.decide import decide
from store import canaries as store
from store import clock
from store.canary_stats import arm_stats

log = logging.getLogger("onthejob.learner")

LOOK_EVERY = 10.0  # seconds between looks at the running canaries
BY = "learner"


class Canaries:
    """Decide the running canaries from their arms' stats."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.last_look = float("-inf")
        self.told: set[int] = set()  # shared canaries whose promotion was left to an operator

    def decide_running(self) -> int:
        """Look at every running canary (at most every LOOK_EVERY s); how many were decided."""
        if time.monotonic() - self.last_look < LOOK_EVERY:
            return 0
        self.last_look = time.monotonic()
        engine, decided = self.engine, 0
        with engine.connect() as conn:
            running = store.list_canaries(conn, status=store.RUNNING)
        for canary in running:
            now = clock.now()
            with engine.connect() as conn:
                arms = arm_stats(conn, canary, now=now)
            decision = decide(canary, arms, now=now)
            if decision is None:
                continue
            if decision.action == "promote" and canary["tenant"] is None:
                self._leave_to_operator(canary["id"], decision.reason)
                continue
            act = store.promote if decision.action == "promote" else store.roll_back
            try:
                with engine.begin() as conn:
                    act(conn, canary_id=canary["id"], by=BY, reason=decision.reason, now=now)
            except store.CanaryError as exc:  # decided meanwhile by an operator, or gone
                log.info("canary %s: not decided by the learner: %s", canary["id"], exc)
                continue
            decided += 1
            scope = canary["tenant"] or "the shared policy"
            log.info(
                "canary %s (%s, %s against %s): %s: %s",
                *(canary["id"], scope, canary["candidate"], canary["incumbent"]),
                *("promoted" if decision.action == "promote" else "rolled back", decision.reason),
            )
        return decided

    def _leave_to_operator(self, canary_id: int, reason: str) -> None:
        if canary_id in self.told:
            return
        self.told.add(canary_id)
        log.warning(
            "canary %s: %s; the shared policy's candidate is served by a swap of every "
            "replica, which the learner does not do from a canary yet: an operator can "
            "promote it (POST /admin/api/canaries/%s/promote)",
            canary_id,
            reason,
            canary_id,
        )
