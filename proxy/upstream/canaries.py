"""The running canaries (store/canaries.py) and the candidate a call is sent to.

While a canary runs for a scope (a tenant, or the shared policy for the calls of no tenant),
a share of that scope's sessions is sent to its candidate (proxy/upstream/canary_assignment.py:
sticky per session, at random across sessions). The candidate is a LoRA adapter: a call of
its arm goes to it only on a replica that has it loaded (the pool reads the replicas'
adapters while one is wanted), elsewhere to what serves the scope, and the record says which
version answered. A candidate that is full weights is loaded on no replica as an adapter, so
every call goes to the incumbent: the canary of full weights on a subset of the replicas is
not built yet.

Followed from the store like the tenants (proxy/base/followed.py): every `poll_interval`
seconds, at once after a change through this process's admin API.
"""

from __future__ import annotations

from sqlalchemy import Engine

from proxy.base.followed import Followed
from proxy.upstream.canary_assignment import in_candidate_arm
from proxy.upstream.replicas import UpstreamPool
from store import canaries as store
from store.canaries import CanaryRule


class CanaryTable(Followed[list[CanaryRule]]):
    what = "canaries"

    def __init__(self, engine: Engine, pool: UpstreamPool, *, poll_interval: float) -> None:
        super().__init__(engine, poll_interval=poll_interval)
        self.pool = pool
        self.rules: list[CanaryRule] = []
        self._by_tenant: dict[str | None, CanaryRule] = {}

    def runs_for(self, tenant: str | None) -> bool:
        """Whether a canary runs for the scope; cheap (the hot path)."""
        return tenant in self._by_tenant

    def candidate_for(self, tenant: str | None, key: str) -> str | None:
        """The candidate adapter the call with this sticky key goes to, or None (no canary
        for its scope, or the call is in the incumbent's arm)."""
        rule = self._by_tenant.get(tenant)
        if rule is None or not in_candidate_arm(rule.id, key, rule.share):
            return None
        return rule.candidate

    # -- following the store (proxy/base/followed.py) ---------------------------------------------
    def _read(self) -> list[CanaryRule]:
        with self.engine.connect() as conn:
            return store.running(conn)

    def _install(self, value: list[CanaryRule]) -> None:
        self.rules = value
        self._by_tenant = {rule.tenant: rule for rule in value}
        self.pool.want_adapters("canaries", frozenset(rule.candidate for rule in value))

    def reload(self) -> None:
        """After a change through this process's admin API (in its thread): effective at once."""
        rules = self._read()
        self.changed_here(lambda: self._install(rules))
