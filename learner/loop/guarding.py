"""The regression guard in the loop: each new version judged against its parent, rolled
back if it regressed a guarded type (learner/guard_run.py runs the evals)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from learner.guard import GuardConfig
from learner.guard_run import Guard
from learner.loop.base import LEASE_WAIT, LearnerBase
from learner.swap.versions import serve_version
from store import policy_versions
from store.guard_records import guard_decision, mark_rolled_back

log = logging.getLogger("onthejob.learner")


class Guarding(LearnerBase):
    """Judge each version that starts serving (--guard)."""

    def _start_guard(self, path: Path) -> None:
        """The regression guard: the serving version's scores are the baseline; one that
        served before the guard could judge it (the learner stopped in between) is judged
        now against its parent's."""
        assert self.serving is not None
        self.guard = Guard(
            GuardConfig.load(path),
            self.engine,
            self.config.database_url,
            activity=lambda text: setattr(self, "activity", text),
        )
        parent = self._parent()
        if self.guard.known(self.serving) is None and parent and self.guard.known(parent):
            self._guard_step(None)
        else:
            self.guard.baseline(self.serving)

    def _parent(self) -> dict[str, Any] | None:
        assert self.serving is not None
        if not self.serving["parent"]:
            return None
        with self.engine.connect() as conn:
            return policy_versions.version(conn, version=self.serving["parent"])

    def _guard_step(self, step: int | None) -> None:
        """Judge the version that just started serving; roll it back to its parent (the last
        kept version) if it regressed a guarded type."""
        assert self.guard is not None and self.serving is not None
        candidate, kept = self.serving, self._parent()
        if kept is None:
            return
        decision = self.guard.check(candidate, kept, step=step)
        self.reporter.guard(
            self.step if step is None else step,
            {"outcome": decision.outcome, "types": [v.state() for v in decision.verdicts]},
        )
        if decision.outcome != "rolled_back":
            return
        with self.engine.connect() as conn:
            now_serving = policy_versions.serving_version(conn)
        if now_serving is None or now_serving["version"] != candidate["version"]:
            # an operator changed what serves during the evals: theirs is the last word
            log.warning("guard: %s no longer serves; not rolled back", candidate["version"])
            return
        self.activity = f"guard: rolling {candidate['version']} back to {kept['version']}"
        # a stop asked for meanwhile comes once the rollback is recorded as the guard's
        with self.stopping.swap():
            label = serve_version(
                self.engine,
                self.config.upstreams,
                kept["version"],
                action="rollback",
                lease_wait=LEASE_WAIT,
                drain_timeout=self.config.swap_drain_timeout,
            )
            with self.engine.begin() as conn:
                recorded = guard_decision(conn, candidate["version"])
                mark_rolled_back(
                    conn, version=candidate["version"], serving=label, decision=recorded
                )
                serving = policy_versions.serving_version(conn)
        log.warning(
            "guard: %s rolled back to %s, serving as %s: %s",
            candidate["version"],
            kept["version"],
            label,
            decision.reason,
        )
        assert serving is not None
        self._follow(serving, by="the regression guard")
