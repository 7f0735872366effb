"""The regression guard in the loop: each new version judged against its parent, rolled
back if it regressed a guarded type (learner/guard_run.py runs the evals)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from learner.guard import GuardConfig
from learner.guard_run import Guard, publish_config
from learner.layout import is_adapter
from learner.loop.base import LEASE_WAIT, LearnerBase
from learner.swap import lease
from learner.swap.routing import wait_routed
from learner.swap.versions import serve_version
from store import policy_versions, tenants
from store.guard_records import guard_decision, mark_rolled_back

log = logging.getLogger("onthejob.learner")


class Guarding(LearnerBase):
    """Judge each version that starts serving (--guard)."""

    def _start_guard(self, path: Path) -> None:
        """The regression guard: the serving version's scores are the baseline; one that
        served before the guard could judge it (the learner stopped in between) is judged
        now against its parent's. With --tenants each tenant has a guard of its own (its
        entry in the file), started with its lineage (`_start_tenant_guard`)."""
        config = GuardConfig.load(path)
        if self.config.tenants:
            self.guard_config = config
            publish_config(self.engine, config)
            return
        self._guard_from(config)

    def _start_tenant_guard(self) -> None:
        """The lineage's guard: the tenant's entry in the guard file, its evals run as the
        tenant; a tenant without one is not guarded (said once)."""
        assert self.lineage is not None
        config = None if self.guard_config is None else self.guard_config.for_tenant(self.lineage)
        if config is None:
            if self.guard_config is not None:
                log.warning(
                    "guard: tenant %s has no [tenants.%s] in the guard file: its versions "
                    "serve unjudged",
                    self.lineage,
                    self.lineage,
                )
            return
        self._guard_from(config)

    def _guard_from(self, config: GuardConfig) -> None:
        """The lineage's guard (the shared policy's or a tenant's), and its baseline."""
        self.guard = Guard(
            config,
            self.engine,
            self.config.database_url,
            activity=lambda text: setattr(self, "activity", text),
            tenant=self.lineage,
        )
        assert self.serving is not None
        if self.lineage is not None:
            self._await_routed(self.serving)
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
        if self.lineage is not None:
            self._await_routed(candidate)
        decision = self.guard.check(candidate, kept, step=step)
        self.reporter.guard(
            self.step if step is None else step,
            {"outcome": decision.outcome, "types": [v.state() for v in decision.verdicts]},
        )
        if decision.outcome != "rolled_back":
            return
        with self.engine.connect() as conn:
            now_serving = policy_versions.serving_version(conn, self.lineage)
        if now_serving is None or now_serving["version"] != candidate["version"]:
            # an operator changed what serves during the evals: theirs is the last word
            log.warning("guard: %s no longer serves; not rolled back", candidate["version"])
            return
        self.activity = f"guard: rolling {candidate['version']} back to {kept['version']}"
        # a stop asked for meanwhile comes once the rollback is recorded as the guard's
        with self.stopping.swap():
            if self.lineage is not None and kept.get("tenant") != self.lineage:
                label = self._tenant_back_to_shared()
            else:
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
                # a tenant with no version of its own left serving gets the shared policy
                serving = policy_versions.serving_version(
                    conn, self.lineage
                ) or policy_versions.serving_version(conn)
        log.warning(
            "guard: %s%s rolled back to %s, serving as %s: %s",
            candidate["version"],
            "" if self.lineage is None else f" (tenant {self.lineage})",
            kept["version"],
            label,
            decision.reason,
        )
        assert serving is not None
        self._follow(serving, by="the regression guard")

    def _tenant_back_to_shared(self) -> str:
        """A tenant's first version rolled back: the tenant's calls go to the shared policy
        again (its pointer cleared, as an operator's `PUT .../serving null`); nothing is
        loaded or reloaded. The shared policy's serving version, which answers them."""
        assert self.lineage is not None
        with lease.held(self.engine, self.holder, wait=LEASE_WAIT):
            with self.engine.begin() as conn:
                tenants.set_serving(conn, name=self.lineage, version=None, now=datetime.now(UTC))
                shared = policy_versions.serving_version(conn)
        assert shared is not None
        log.info("guard: tenant %s answered by the shared policy again", self.lineage)
        return str(shared["version"])

    def _await_routed(self, version: dict[str, Any]) -> None:
        """A tenant's evals must be answered by the version they judge: an adapter of its
        own serves once every proxy routes the tenant's calls to it (every replica has it
        loaded); the shared policy's version answers it at once."""
        assert self.lineage is not None
        if version.get("tenant") != self.lineage or not is_adapter(
            Path(version["checkpoint_path"])
        ):
            return
        waited = wait_routed(self.engine, self.lineage, version["version"])
        if waited is not None:
            log.info(
                "guard: every proxy routes tenant %s to %s (waited %.2f s)",
                self.lineage,
                version["version"],
                waited,
            )
        else:
            log.warning(
                "guard: not every proxy routes tenant %s to %s yet; evaluating anyway",
                self.lineage,
                version["version"],
            )
