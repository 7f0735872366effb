"""The regression guard in the loop: each new version judged against its parent, rolled
back if it regressed a guarded type (learner/guard_run.py runs the evals)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from learner.guard import GuardConfig
from learner.guard_run import Guard, publish_config
from learner.layout import is_adapter
from learner.loop.state import LEASE_WAIT, LoopState
from learner.loop.weights import Weights
from learner.swap import lease
from learner.swap.routing import wait_routed
from learner.swap.versions import serve_version
from store import policy_versions, tenants
from store.guard_records import guard_decision, mark_rolled_back
from store.policy_versions import PolicyVersionRow

log = logging.getLogger("onthejob.learner")


class Guarding:
    """Judge each version of the lineage that starts serving (--guard)."""

    def __init__(self, state: LoopState, weights: Weights) -> None:
        self.state = state
        self.weights = weights

    def start(self, path: Path) -> None:
        """The regression guard: the serving version's scores are the baseline; one that
        served before the guard could judge it (the learner stopped in between) is judged
        now against its parent's. With --tenants each tenant has a guard of its own (its
        entry in the file), started with its lineage (`start_for_tenant`)."""
        config = GuardConfig.load(path)
        if self.state.config.tenants:
            self.state.guard_config = config
            publish_config(self.state.engine, config)
            return
        self._guard_from(config)

    def start_for_tenant(self) -> None:
        """The lineage's guard: the tenant's entry in the guard file, its evals run as the
        tenant; a tenant without one is not guarded (said once)."""
        tenant, guard_config = self.state.tenant, self.state.guard_config
        assert tenant is not None
        config = None if guard_config is None else guard_config.for_tenant(tenant)
        if config is None:
            if guard_config is not None:
                log.warning(
                    "guard: tenant %s has no [tenants.%s] in the guard file: its versions "
                    "serve unjudged",
                    tenant,
                    tenant,
                )
            return
        self._guard_from(config)

    def _guard_from(self, config: GuardConfig) -> None:
        """The lineage's guard (the shared policy's or a tenant's), and its baseline."""
        state, lineage = self.state, self.state.lineage
        guard = lineage.guard = Guard(
            config,
            state.engine,
            state.config.database_url,
            activity=lambda text: setattr(state, "activity", text),
            tenant=lineage.tenant,
        )
        assert lineage.serving is not None
        if lineage.tenant is not None:
            self._await_routed(lineage.serving)
        parent = self._parent()
        if guard.known(lineage.serving) is None and parent and guard.known(parent):
            self.check(None)
        else:
            guard.baseline(lineage.serving)

    def _parent(self) -> PolicyVersionRow | None:
        lineage = self.state.lineage
        assert lineage.serving is not None
        if not lineage.serving["parent"]:
            return None
        with self.state.engine.connect() as conn:
            return policy_versions.version(conn, version=lineage.serving["parent"])

    def check(self, step: int | None) -> None:
        """Judge the version that just started serving; roll it back to its parent (the last
        kept version) if it regressed a guarded type."""
        state, lineage = self.state, self.state.lineage
        assert lineage.guard is not None and lineage.serving is not None
        candidate, kept = lineage.serving, self._parent()
        if kept is None:
            return
        if state.tenant is not None:
            self._await_routed(candidate)
        decision = lineage.guard.check(candidate, kept, step=step)
        state.reporter.guard(
            state.step if step is None else step,
            {"outcome": decision.outcome, "types": [v.state() for v in decision.verdicts]},
        )
        if decision.outcome != "rolled_back":
            return
        with state.engine.connect() as conn:
            now_serving = policy_versions.serving_version(conn, state.tenant)
        if now_serving is None or now_serving["version"] != candidate["version"]:
            # an operator changed what serves during the evals: theirs is the last word
            log.warning("guard: %s no longer serves; not rolled back", candidate["version"])
            return
        state.activity = f"guard: rolling {candidate['version']} back to {kept['version']}"
        # a stop asked for meanwhile comes once the rollback is recorded as the guard's
        with state.stopping.swap():
            if state.tenant is not None and kept.get("tenant") != state.tenant:
                label = self._tenant_back_to_shared()
            else:
                label = serve_version(
                    state.engine,
                    state.config.upstreams,
                    kept["version"],
                    action="rollback",
                    lease_wait=LEASE_WAIT,
                    drain_timeout=state.config.swap_drain_timeout,
                )
            with state.engine.begin() as conn:
                recorded = guard_decision(conn, candidate["version"])
                mark_rolled_back(
                    conn, version=candidate["version"], serving=label, decision=recorded
                )
                # a tenant with no version of its own left serving gets the shared policy
                serving = policy_versions.serving_version(
                    conn, state.tenant
                ) or policy_versions.serving_version(conn)
        log.warning(
            "guard: %s%s rolled back to %s, serving as %s: %s",
            candidate["version"],
            "" if state.tenant is None else f" (tenant {state.tenant})",
            kept["version"],
            label,
            decision.reason,
        )
        assert serving is not None
        self.weights.follow(serving, by="the regression guard")

    def _tenant_back_to_shared(self) -> str:
        """A tenant's first version rolled back: the tenant's calls go to the shared policy
        again (its pointer cleared, as an operator's `PUT .../serving null`); nothing is
        loaded or reloaded. The shared policy's serving version, which answers them."""
        state = self.state
        assert state.tenant is not None
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT):
            with state.engine.begin() as conn:
                tenants.set_serving(conn, name=state.tenant, version=None, now=datetime.now(UTC))
                shared = policy_versions.serving_version(conn)
        assert shared is not None
        log.info("guard: tenant %s answered by the shared policy again", state.tenant)
        return str(shared["version"])

    def _await_routed(self, version: PolicyVersionRow) -> None:
        """A tenant's evals must be answered by the version they judge: an adapter of its
        own serves once every proxy routes the tenant's calls to it (every replica has it
        loaded); the shared policy's version answers it at once."""
        state = self.state
        assert state.tenant is not None
        if version.get("tenant") != state.tenant or not is_adapter(
            Path(version["checkpoint_path"])
        ):
            return
        waited = wait_routed(state.engine, state.tenant, version["version"])
        if waited is not None:
            log.info(
                "guard: every proxy routes tenant %s to %s (waited %.2f s)",
                state.tenant,
                version["version"],
                waited,
            )
        else:
            log.warning(
                "guard: not every proxy routes tenant %s to %s yet; evaluating anyway",
                state.tenant,
                version["version"],
            )
