"""The running canaries (store/canaries.py) and the candidate a call is sent to.

While a canary runs for a scope (a tenant, or the shared policy for the calls of no tenant),
a share of that scope's sessions is sent to its candidate (proxy/upstream/canary_assignment.py:
sticky per session, at random across sessions). The candidate is a LoRA adapter: a call of
its arm goes to it only on a replica that has it loaded (the pool reads the replicas'
adapters while one is wanted), elsewhere to what serves the scope, and the record says which
version answered. A candidate of full weights serves as the policy version of some of the
replicas: the calls of its arm go to those replicas first, and every other call (any scope's)
to the others first (`replica_preference`); a call goes to a replica of the other side only
where none of its own is open, and is recorded as the version that answered it. The learner
publishes such a candidate on some of the replicas (learner/canary/starts.py), and serves
the incumbent there again once its canary is rolled back.

Followed from the store like the tenants (proxy/base/followed.py): every `poll_interval`
seconds, at once after a change through this process's admin API.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from proxy.base.followed import Followed
from proxy.upstream.canary_assignment import in_candidate_arm
from proxy.upstream.replicas import Replica, UpstreamPool
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

    def replica_preference(self, candidate: str | None) -> Callable[[Replica], bool] | None:
        """Which replicas a call should go to first while a candidate of full weights serves on
        some of the replicas (its policy version, not an adapter): the candidate's arm to
        those, every other call to the rest. None (any replica) when no running canary's
        candidate is a replica's policy version; cheap when no canary runs (the hot path)."""
        if not self.rules:
            return None
        serving = {r.policy_version for r in self.pool.replicas}
        full = {rule.candidate for rule in self.rules} & serving
        if not full:
            return None
        if candidate in full:
            return lambda replica: replica.policy_version == candidate
        return lambda replica: replica.policy_version not in full

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
