"""Which tenant a call belongs to, and the adapter its calls are sent to (store/tenants.py).

A call is its client key's tenant, else its interaction type's: the X-Onthejob-Type header,
or the fingerprint of the call itself (proxy/recording/interaction.py), computed only while
some tenant lists types. The tenants are read from the store every `poll_interval` seconds,
and at once after a change through this process's admin API; while the store is away the
last ones read stay in force.

The pool is told which adapters the tenants serve (`UpstreamPool.wanted_adapters`): it
reads each replica's loaded adapters while any is wanted, and a call is sent to its tenant's
adapter only on a replica that has it loaded. Elsewhere (not loaded yet, unloaded, a replica
restarted) the shared policy answers it, and the record says which version did.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from proxy.recording.interaction import fingerprint
from proxy.upstream.replicas import UpstreamPool
from store import tenants as store
from store.tenants import TenantRule

log = logging.getLogger("onthejob.tenants")


class TenantTable:
    def __init__(self, engine: Engine, pool: UpstreamPool, *, poll_interval: float) -> None:
        self.engine = engine
        self.pool = pool
        self.poll_interval = poll_interval
        self.rules: list[TenantRule] = []
        self._by_key: dict[str, TenantRule] = {}
        self._by_type: dict[str, TenantRule] = {}
        # a change made through this process's admin API while a poll read was in flight
        # wins over what that read found
        self._lock = threading.Lock()
        self._changes = 0

    def tenant_of(
        self, key_name: str | None, explicit_type: str | None, body: Any, user_agent: str | None
    ) -> TenantRule | None:
        """The call's tenant, or None; cheap where no tenant is defined (the hot path)."""
        if key_name is not None and (rule := self._by_key.get(key_name)) is not None:
            return rule
        if not self._by_type:
            return None
        return self._by_type.get(explicit_type or fingerprint(body, user_agent))

    def _install(self, rules: list[TenantRule]) -> None:
        self.rules = rules
        self._by_key = {key: r for r in rules for key in r.client_keys}
        self._by_type = {kind: r for r in rules for kind in r.interaction_types}
        self.pool.wanted_adapters = frozenset(
            r.serving_version for r in rules if r.serving_version is not None
        )

    # -- following the store ---------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self.refresh()
        except SQLAlchemyError as exc:
            log.warning("tenants unreadable at start (%s); read once the store answers", exc)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
            except SQLAlchemyError:
                log.debug("tenants not re-read", exc_info=True)

    async def refresh(self) -> None:
        while True:
            seen = self._changes
            rules = await asyncio.to_thread(self._read)
            with self._lock:
                if seen == self._changes:
                    self._install(rules)
                    return

    def reload(self) -> None:
        """After a change through this process's admin API (in its thread): effective at once."""
        rules = self._read()
        with self._lock:
            self._changes += 1
            self._install(rules)

    def _read(self) -> list[TenantRule]:
        with self.engine.connect() as conn:
            return store.rules(conn)
