"""The learner's own canaries: each new verified version of a scope (a tenant's lineage, or
the shared policy's) first serves a share of the scope's sessions beside the version that
serves the rest, where its settings (learner/canary/settings.py) give it a share.

The candidate must serve beside the incumbent: an adapter (--lora), loaded under its own
name, which the proxies send the candidate's arm to; or the shared policy's full weights,
published on some of two or more replicas (`candidate_replicas`), to which the proxies send
the candidate's arm and every other call to the rest (proxy/upstream/canaries.py). Full
weights on one replica serve their whole scope at once, as without a canary, and the
learner says so once per scope.

The canary is started in the transaction that records the version (learner/loop/publish.py),
by `learner`, with why; from then on it is decided like any other (learner/loop/canaries.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, Engine

from learner.canary.settings import CanarySettings, canary_settings
from learner.config import LearnerConfig
from store import canaries, tenants

log = logging.getLogger("onthejob.learner")

BY = "learner"  # who the learner's canary actions are recorded as


class CanaryStarts:
    """Whether a lineage's new version goes to a canary first, and its start."""

    def __init__(self, engine: Engine, config: LearnerConfig) -> None:
        self.engine = engine
        self.config = config
        self.told: set[str | None] = set()  # scopes told their full weights get no canary

    def settings_for(
        self, tenant: str | None, *, adapter: bool, replicas: int = 1
    ) -> CanarySettings | None:
        """The canary settings of the scope's next version; None: it serves the scope at
        once (no share, or full weights on fewer than two `replicas`, where they cannot
        serve beside the incumbent)."""
        overrides = None
        if tenant is not None:
            with self.engine.connect() as conn:
                overrides = tenants.canary_overrides(conn, tenant)
        settings = canary_settings(self.config, tenant, overrides)
        if not settings.on:
            return None
        if not adapter and (tenant is not None or replicas < 2):
            self._say_full_weights(tenant, settings, replicas)
            return None
        return settings

    def start(
        self,
        conn: Connection,
        *,
        tenant: str | None,
        candidate: str,
        step: int,
        settings: CanarySettings,
        now: datetime,
    ) -> int:
        """Record the canary of `candidate` against what serves the scope now; its id.
        canaries.CanaryError: one runs for the scope already."""
        scope = _scope(tenant)
        return canaries.start_canary(
            conn,
            tenant=tenant,
            candidate=candidate,
            incumbent=canaries.serving_now(conn, tenant),
            share=settings.share,
            min_calls=settings.min_calls,
            time_limit=settings.time_limit,
            default_decision=settings.default_decision,
            by=BY,
            now=now,
            reason=(
                f"step {step}'s version, verified, serves {settings.share:g} of {scope}'s "
                f"sessions before it serves them all ({settings.source})"
            ),
            detail={"step": step, "settings": settings.source},
        )

    def _say_full_weights(
        self, tenant: str | None, settings: CanarySettings, replicas: int
    ) -> None:
        if tenant in self.told:
            return
        self.told.add(tenant)
        log.warning(
            "canary: %s's versions serve all of its traffic at once, not %g of it as a "
            "canary: a canary's candidate serves beside the incumbent as an adapter (--lora), "
            "or as full weights on some of two or more replicas (this learner has %d)",
            _scope(tenant),
            settings.share,
            replicas,
        )


def candidate_replicas(upstreams: Sequence[str], share: float) -> list[str]:
    """The replicas a full-weight candidate serves on: the number its share of the sessions
    comes nearest to, at least one and never all; the last ones, so that the first (whose
    version start-up reads) keeps serving the incumbent."""
    count = min(len(upstreams) - 1, max(1, int(share * len(upstreams) + 0.5)))
    if count < 1:
        raise ValueError("a full-weight candidate needs two or more replicas")
    return list(upstreams[len(upstreams) - count :])


def _scope(tenant: str | None) -> str:
    return "the shared policy" if tenant is None else f"tenant {tenant}"
