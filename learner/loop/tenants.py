"""`learn --tenants`: each tenant's adapter trained on its own traffic, the tenants in turn.

Each tenant (store/tenants.py) has a lineage of its own: its versions (`policy_versions.
tenant`), the one that serves its calls (the tenant's pointer, which the proxies route by),
its trainer with its optimizer state, and its running baselines. The learner keeps one
`Lineage` per tenant. Switching to a tenant swaps the lineage's state into the learner's own
fields, so a tenant's step runs exactly the code of a step of the shared policy, on that
tenant's traffic only (`grade_queue.only_tenant`).

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
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from learner.fresh_wait import FreshWait
from learner.grouping import Baselines
from learner.loop.base import LEASE_WAIT, LearnerBase, RestoreFailed, baseline_key
from learner.swap import lease
from learner.swap.orphan_adapters import unload_orphaned_adapters
from learner.swap.publisher import Fingerprint
from learner.traffic import yielding_to
from store import learner_state, policy_versions, tenants

log = logging.getLogger("onthejob.learner")

# the learner's fields that are a lineage's own: swapped in for its turn
LINEAGE_FIELDS = (
    "serving",
    "baselines",
    "trainer",
    "publisher",
    "fresh",
    "traffic",
    "_trainer_is_serving",
    "_needs_restore",
    "guard",
)


@dataclass
class Lineage:
    tenant: str
    state: dict[str, Any]
    trained_at: float = -math.inf  # time.monotonic() of its last step
    steps: int = 0


class Tenants(LearnerBase):
    """Train the tenants' adapters in turn (the learner's `--tenants` mode)."""

    _lineages: dict[str, Lineage]
    _said_no_tenants: bool
    _steered: dict[str, str | None]  # the tenants an operator steers, by the pointer said
    _swept_for: set[str] | None  # the tenants at the last unload of deleted ones' adapters

    def train_tenants(self) -> bool:
        """At most one step, for the first tenant in fair order whose batch is ready; a
        tenant an operator steers by hand (`tenants.steered_by_hand`) is left alone."""
        with self.engine.connect() as conn:
            rules = tenants.rules(conn)
            own = {rule.name: policy_versions.serving_name(conn, rule.name) for rule in rules}
        names = [rule.name for rule in rules]
        steered = {
            rule.name: rule.serving_version
            for rule in rules
            if tenants.steered_by_hand(rule.serving_version, own[rule.name])
        }
        if not steered or lease.who(self.engine) is None:
            self._say_steered(steered)
        # else a publish is under way, which records a version and then moves its pointer:
        # those tenants wait a turn, unsaid, till it is done and the two agree or not
        if not names and not self._lineages and not self._said_no_tenants:
            log.warning(
                "--tenants: no tenant is defined yet, nothing trains until one is "
                "(PUT /admin/api/tenants/NAME, docs/tenants.md)"
            )
            self._said_no_tenants = True
        for gone in set(self._lineages) - set(names):
            log.info("tenant %s deleted: its adapter is no longer trained", gone)
            del self._lineages[gone]
        if self._swept_for is None or self._swept_for - set(names):
            self._unload_deleted_tenants(set(names))
        # least recently trained first; a tenant not started yet before any
        order = sorted(
            names, key=lambda n: self._lineages[n].trained_at if n in self._lineages else -math.inf
        )
        for name in order:
            if name in steered:
                continue
            try:
                lineage = self._lineages.get(name) or self._start_lineage(name)
                with self.as_lineage(lineage):
                    if self._needs_restore:
                        self._restore_lineage()
                    trained = self.maybe_train()
            except RestoreFailed as exc:
                log.warning("tenant %s skipped this turn: %s", name, exc)
                continue
            if trained:
                lineage.trained_at = time.monotonic()
                lineage.steps += 1
                log.info("tenant %s: step %d (its step %d)", name, self.step, lineage.steps)
                return True
        return False

    def _unload_deleted_tenants(self, names: set[str]) -> None:
        """The adapters of tenants deleted since the last look (at start: ever) out of the
        replicas, under the publish lease (a rollback may be loading one); a store or a
        replica that is away: tried again at the next look."""
        try:
            with lease.held(self.engine, self.holder, wait=LEASE_WAIT):
                unloaded = unload_orphaned_adapters(self.engine, self.config.upstreams)
        except (SQLAlchemyError, lease.LeaseBusy) as exc:
            log.warning("deleted tenants' adapters not unloaded yet: %s", exc)
            return
        if unloaded:
            log.info("deleted tenants' adapters unloaded: %s", ", ".join(sorted(unloaded)))
        self._swept_for = names

    def _save_lineages_at_stop(self) -> None:
        """Each tenant's optimizer state beside its serving adapter, as the shared policy's
        is at a clean stop (`_save_optimizer_at_stop`): a restart continues its AdamW
        moments. Not for a tenant still on the shared policy's version: those are not its."""
        for lineage in list(self._lineages.values()):
            serving = lineage.state.get("serving") or {}
            if serving.get("tenant") != lineage.tenant:
                continue
            with self.as_lineage(lineage):
                self._save_optimizer_at_stop()

    def _say_steered(self, steered: dict[str, str | None]) -> None:
        """Once per pointer an operator set: why the tenant does not train."""
        for name, pointer in steered.items():
            if self._steered.get(name, "") != pointer:
                log.warning(
                    "tenant %s: its calls go to %s, which an operator set and its lineage does "
                    "not serve: it is not trained, and nothing of the learner's is put back "
                    "under it, while the operator steers it (onthejob rollback VERSION makes "
                    "a version of its lineage serve again, and it trains on from there)",
                    name,
                    pointer or "the shared policy",
                )
        self._steered = dict(steered)

    @contextlib.contextmanager
    def as_lineage(self, lineage: Lineage) -> Iterator[None]:
        """The learner's fields hold the tenant's state for the block, the shared policy's
        again after it (whatever the block raised)."""
        shared = {name: getattr(self, name) for name in LINEAGE_FIELDS}
        for name in LINEAGE_FIELDS:
            setattr(self, name, lineage.state[name])
        self.lineage = lineage.tenant
        try:
            yield
        finally:
            lineage.state = {name: getattr(self, name) for name in LINEAGE_FIELDS}
            for name, value in shared.items():
                setattr(self, name, value)
            self.lineage = None

    def _start_lineage(self, tenant: str) -> Lineage:
        """The tenant's trainer from what serves its calls; its own serving adapter (a
        restart) is loaded again and verified before it trains."""
        assert self.serving is not None
        with self.engine.connect() as conn:
            own = policy_versions.serving_version(conn, tenant)
            states = {
                key: learner_state.get_state(conn, baseline_key(key, tenant))
                for key in Baselines.KEYS
            }
        lineage = Lineage(
            tenant,
            {
                "serving": own or self.serving,
                "baselines": Baselines.from_states(states, self.config.type_baseline),
                "trainer": None,
                "publisher": None,
                "fresh": FreshWait(self.config.fresh_wait),
                "traffic": yielding_to(self.config.upstreams, self.config.yield_to_traffic),
                "_trainer_is_serving": False,
                "_needs_restore": own is not None,
                "guard": None,
            },
        )
        with self.as_lineage(lineage):
            assert self.serving is not None
            source = Path(self.serving["checkpoint_path"])
            self.trainer = self._trainer(source)
            self._load_optimizer(source)
            self._trainer_is_serving = True
            self.publisher = self._publisher(source)
            if self._needs_restore:
                self._restore_lineage()  # its evals must be answered by what serves it
            self._start_tenant_guard()
        self._lineages[tenant] = lineage
        log.info(
            "tenant %s: trains from %s%s",
            tenant,
            lineage.state["serving"]["version"],
            "" if own else " (what served its calls so far)",
        )
        return lineage

    def _restore_lineage(self) -> None:
        """Serve the tenant's recorded version again: its adapter loaded into every
        replica, verified against its probe, and the tenant's pointer set."""
        assert self.serving is not None and self.publisher is not None
        fingerprint = Fingerprint.from_state(self.serving["probe"], at_least=self.tolerance)
        with lease.held(self.engine, self.holder, wait=LEASE_WAIT):
            result = self.publisher.rollback(
                Path(self.serving["checkpoint_path"]),
                self.serving["version"],
                fingerprint=fingerprint,
            )
        if not result.ok:
            raise RestoreFailed(f"could not restore {self.serving['version']}: {result.error}")
        self._needs_restore = False
