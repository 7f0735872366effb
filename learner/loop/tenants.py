"""`learn --tenants`: each tenant's adapter trained on its own traffic, the tenants in turn.

Each tenant (store/tenants.py) has a lineage of its own: its versions (`policy_versions.
tenant`), the one that serves its calls (the tenant's pointer, which the proxies route by),
its trainer with its optimizer state, and its running baselines. The learner keeps one
`Lineage` per tenant (learner/loop/state.py). A tenant's turn makes its lineage the one the
parts work on (`LoopState.lineage`), so a tenant's step runs exactly the code of a step of the
shared policy, on that tenant's traffic only (`grade_queue.only_tenant`).

Fair turns: each iteration offers a step to the tenants in the order they last trained,
least recently first, and takes at most one; a tenant with much traffic cannot take step
after step while another has a batch ready. A tenant whose adapter cannot be restored is
skipped (and tried again next time); the others train on, and the proxies go on routing
every tenant to what its pointer names.

A tenant's first version starts from what served its calls until then: the shared policy's
serving version (a fresh adapter on the base, or the shared adapter trained on).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from learner.grouping import Baselines
from learner.loop.guarding import Guarding
from learner.loop.publish import Publishing
from learner.loop.state import LEASE_WAIT, Lineage, LoopState, RestoreFailed, baseline_key
from learner.loop.step import Stepping
from learner.loop.weights import Weights
from learner.swap import lease
from learner.swap.lora_slots import SlotCheck
from learner.swap.orphan_adapters import unload_orphaned_adapters
from learner.swap.publisher import Fingerprint
from store import learner_state, policy_versions, tenants

log = logging.getLogger("onthejob.learner")


@dataclass
class TenantTurn:
    """A tenant's lineage and its turns: when it last trained, how many steps it made."""

    lineage: Lineage
    trained_at: float = -math.inf  # time.monotonic() of its last step
    steps: int = 0


class Tenants:
    """Train the tenants' adapters in turn (the learner's `--tenants` mode)."""

    def __init__(
        self,
        state: LoopState,
        weights: Weights,
        publishing: Publishing,
        guarding: Guarding,
        stepping: Stepping,
    ) -> None:
        self.state = state
        self.weights = weights
        self.publishing = publishing
        self.guarding = guarding
        self.stepping = stepping
        self.turns: dict[str, TenantTurn] = {}
        self.said_no_tenants = False
        self.steered: dict[str, str | None] = {}  # the tenants an operator steers, by pointer
        self.swept_for: set[str] | None = None  # the tenants at the last unload of deleted ones
        # vLLM's adapter slots against the tenants defined (learner/swap/lora_slots.py)
        self.slots = SlotCheck(state.config.upstreams)
        self.slots_for: set[str] = set()  # the tenants they were last checked for

    def train(self) -> bool:
        """At most one step, for the first tenant in fair order whose batch is ready; a
        tenant an operator steers by hand (`tenants.steered_by_hand`) is left alone."""
        engine = self.state.engine
        with engine.connect() as conn:
            rules = tenants.rules(conn)
            own = {rule.name: policy_versions.serving_name(conn, rule.name) for rule in rules}
            # A tenant deleted between the two reads above reads as its pointer on the shared
            # policy and its lineage serving nothing: no operator's hand, so it would be
            # started and trained. Only those still defined after `own` was read count.
            still = {rule.name for rule in tenants.rules(conn)}
        rules = [rule for rule in rules if rule.name in still]
        names = [rule.name for rule in rules]
        steered = {
            rule.name: rule.serving_version
            for rule in rules
            if tenants.steered_by_hand(rule.serving_version, own[rule.name])
        }
        if not steered or lease.who(engine) is None:
            self._say_steered(steered)
        # else a publish is under way, which records a version and then moves its pointer:
        # those tenants wait a turn, unsaid, till it is done and the two agree or not
        if not names and not self.turns and not self.said_no_tenants:
            log.warning(
                "--tenants: no tenant is defined yet, nothing trains until one is "
                "(PUT /admin/api/tenants/NAME, docs/tenants.md)"
            )
            self.said_no_tenants = True
        for gone in set(self.turns) - set(names):
            log.info("tenant %s deleted: its adapter is no longer trained", gone)
            del self.turns[gone]
            self.weights.release(gone)  # its adapter's slot on the shared base
        if self.swept_for is None or self.swept_for - set(names):
            self._unload_deleted_tenants(set(names))
        if names and set(names) != self.slots_for:
            self.slots.check(len(names), self.state.config.max_staleness)
            self.slots_for = set(names)
        # least recently trained first; a tenant not started yet before any
        order = sorted(
            names, key=lambda n: self.turns[n].trained_at if n in self.turns else -math.inf
        )
        for name in order:
            if name in steered:
                continue
            try:
                turn = self.turns.get(name) or self._start(name)
                with self.as_lineage(turn.lineage):
                    if turn.lineage.needs_restore:
                        self._restore_lineage()
                    trained = self.stepping.maybe_train()
            except RestoreFailed as exc:
                log.warning("tenant %s skipped this turn: %s", name, exc)
                continue
            if trained:
                turn.trained_at = time.monotonic()
                turn.steps += 1
                log.info("tenant %s: step %d (its step %d)", name, self.state.step, turn.steps)
                return True
        return False

    def _unload_deleted_tenants(self, names: set[str]) -> None:
        """The adapters of tenants deleted since the last look (at start: ever) out of the
        replicas, under the publish lease (a rollback may be loading one); a store or a
        replica that is away: tried again at the next look."""
        state = self.state
        try:
            with lease.held(state.engine, state.holder, wait=LEASE_WAIT):
                unloaded = unload_orphaned_adapters(
                    state.engine, state.config.upstreams, memory=state.adapter_memory
                )
        except (SQLAlchemyError, lease.LeaseBusy) as exc:
            log.warning("deleted tenants' adapters not unloaded yet: %s", exc)
            return
        if unloaded:
            log.info("deleted tenants' adapters unloaded: %s", ", ".join(sorted(unloaded)))
        self.swept_for = names

    def save_at_stop(self) -> None:
        """Each tenant's optimizer state beside its serving adapter, as the shared policy's
        is at a clean stop (`Weights.save_optimizer_at_stop`): a restart continues its AdamW
        moments. Not for a tenant still on the shared policy's version: those are not its."""
        for turn in list(self.turns.values()):
            serving = turn.lineage.serving or {}
            if serving.get("tenant") != turn.lineage.tenant:
                continue
            with self.as_lineage(turn.lineage):
                self.weights.save_optimizer_at_stop()

    def _say_steered(self, steered: dict[str, str | None]) -> None:
        """Once per pointer an operator set: why the tenant does not train."""
        for name, pointer in steered.items():
            if self.steered.get(name, "") != pointer:
                log.warning(
                    "tenant %s: its calls go to %s, which an operator set and its lineage does "
                    "not serve: it is not trained, and nothing of the learner's is put back "
                    "under it, while the operator steers it (onthejob rollback VERSION makes "
                    "a version of its lineage serve again, and it trains on from there)",
                    name,
                    pointer or "the shared policy",
                )
        self.steered = dict(steered)

    @contextlib.contextmanager
    def as_lineage(self, lineage: Lineage) -> Iterator[None]:
        """The parts work on the tenant's lineage for the block, on the shared policy's
        again after it (whatever the block raised)."""
        self.state.lineage = lineage
        try:
            yield
        finally:
            self.state.lineage = self.state.shared

    def _start(self, tenant: str) -> TenantTurn:
        """The tenant's trainer from what serves its calls; its own serving adapter (a
        restart) is loaded again and verified before it trains."""
        state = self.state
        assert state.shared.serving is not None
        with state.engine.connect() as conn:
            own = policy_versions.serving_version(conn, tenant)
            states = {
                key: learner_state.get_state(conn, baseline_key(key, tenant))
                for key in Baselines.KEYS
            }
        lineage = Lineage.fresh_for(state.config, tenant, own or state.shared.serving)
        lineage.baselines = Baselines.from_states(states, state.config.type_baseline)
        lineage.needs_restore = own is not None
        with self.as_lineage(lineage):
            assert lineage.serving is not None
            source = Path(lineage.serving["checkpoint_path"])
            self.weights.load(source)
            lineage.publisher = self.publishing.publisher_for(source)
            if lineage.needs_restore:
                self._restore_lineage()  # its evals must be answered by what serves it
            self.guarding.start_for_tenant()
        turn = self.turns[tenant] = TenantTurn(lineage)
        log.info(
            "tenant %s: trains from %s%s",
            tenant,
            lineage.serving["version"],
            "" if own else " (what served its calls so far)",
        )
        return turn

    def _restore_lineage(self) -> None:
        """Serve the tenant's recorded version again: its adapter loaded into every
        replica, verified against its probe, and the tenant's pointer set."""
        state, lineage = self.state, self.state.lineage
        assert lineage.serving is not None and lineage.publisher is not None
        fingerprint = Fingerprint.from_state(lineage.serving["probe"], at_least=state.tolerance)
        with lease.held(state.engine, state.holder, wait=LEASE_WAIT):
            result = lineage.publisher.rollback(
                Path(lineage.serving["checkpoint_path"]),
                lineage.serving["version"],
                fingerprint=fingerprint,
            )
        if not result.ok:
            raise RestoreFailed(f"could not restore {lineage.serving['version']}: {result.error}")
        lineage.needs_restore = False
