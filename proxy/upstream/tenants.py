"""Which tenant a call belongs to, and the adapter its calls are sent to (store/tenants.py).

A call is its client key's tenant, else its interaction type's: the X-Onthejob-Type header,
or the fingerprint of the call itself (proxy/recording/interaction.py), computed only while
some tenant lists types. The tenants are followed from the store like the client keys
(proxy/base/followed.py): every `poll_interval` seconds, at once after a change through this
process's admin API, the last ones read while the store is away.

The pool is told which adapters the tenants serve (`UpstreamPool.want_adapters`): it
reads each replica's loaded adapters while any is wanted, and a call is sent to its tenant's
adapter only on a replica that has it loaded. Elsewhere (not loaded yet, unloaded, a replica
restarted) the shared policy answers it, and the record says which version did.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from proxy.base.followed import Followed
from proxy.recording.interaction import fingerprint
from proxy.upstream.replicas import UpstreamPool
from store import tenants as store
from store.tenants import TenantRule


class TenantTable(Followed[list[TenantRule]]):
    what = "tenants"

    def __init__(self, engine: Engine, pool: UpstreamPool, *, poll_interval: float) -> None:
        super().__init__(engine, poll_interval=poll_interval)
        self.pool = pool
        self.rules: list[TenantRule] = []
        self._by_key: dict[str, TenantRule] = {}
        self._by_type: dict[str, TenantRule] = {}

    def tenant_of(
        self, key_name: str | None, explicit_type: str | None, body: Any, user_agent: str | None
    ) -> TenantRule | None:
        """The call's tenant, or None; cheap where no tenant is defined (the hot path)."""
        if key_name is not None and (rule := self._by_key.get(key_name)) is not None:
            return rule
        if not self._by_type:
            return None
        return self._by_type.get(explicit_type or fingerprint(body, user_agent))

    def routes(self) -> dict[str, str]:
        """The tenants whose calls go to their serving adapter, as every healthy replica has
        it loaded (reported with the proxy's heartbeat: store/gates.py)."""
        replicas = [r for r in self.pool.replicas if r.healthy]
        return {
            rule.name: rule.serving_version
            for rule in self.rules
            if rule.serving_version is not None
            and replicas
            and all(rule.serving_version in r.adapters for r in replicas)
        }

    # -- following the store (proxy/base/followed.py) ---------------------------------------------
    def _read(self) -> list[TenantRule]:
        with self.engine.connect() as conn:
            return store.rules(conn)

    def _install(self, value: list[TenantRule]) -> None:
        self.rules = value
        self._by_key = {key: r for r in value for key in r.client_keys}
        self._by_type = {kind: r for r in value for kind in r.interaction_types}
        self.pool.want_adapters(
            "tenants", frozenset(r.serving_version for r in value if r.serving_version is not None)
        )

    def reload(self) -> None:
        """After a change through this process's admin API (in its thread): effective at once."""
        rules = self._read()
        self.changed_here(lambda: self._install(rules))
