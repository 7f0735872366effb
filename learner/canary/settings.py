"""The settings of a canary the learner starts, and of the watch on it: the learner's
(`learn --canary-share`, `--canary-min-calls`, `--canary-time-limit`, `--canary-default`;
the watch's thresholds are the code's, learner/canary/watch.py `Thresholds`), each
overridden by the tenant's own where it has one (store/tenants.py `CanaryOverrides`, set
through `PUT /admin/api/tenants/NAME/canary`).

A canary splits one scope's sessions, whatever their interaction type, so a type gets
settings of its own through a tenant that lists it. The shared policy's scope has the
learner's. Pure: the caller reads the overrides.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta

from learner.canary.watch import Thresholds
from learner.config import LearnerConfig
from store.tenants import CanaryOverrides


@dataclass(frozen=True)
class CanarySettings:
    """What a canary of a new version of one scope is started with."""

    share: float  # 0: no canary, the version serves its whole scope at once
    min_calls: int
    time_limit: timedelta
    default_decision: str  # promote | rollback
    source: str  # whose they are, for the log and the canary's record

    @property
    def on(self) -> bool:
        return self.share > 0.0

    def summary(self) -> str:
        return (
            f"share {self.share:g}, {self.min_calls} calls an arm before a decision, "
            f"{self.time_limit.total_seconds():g} s, then {self.default_decision} "
            f"({self.source})"
        )


def canary_settings(
    config: LearnerConfig, tenant: str | None, overrides: CanaryOverrides | None
) -> CanarySettings:
    """The learner's settings, each that the tenant sets replaced by the tenant's."""
    own = overrides or {}
    return CanarySettings(
        share=float(own.get("share", config.canary_share)),
        min_calls=int(own.get("min_calls", config.canary_min_calls)),
        time_limit=timedelta(seconds=float(own.get("time_limit_s", config.canary_time_limit))),
        default_decision=str(own.get("default_decision", config.canary_default)),
        source=_source(tenant, own, ("share", "min_calls", "time_limit_s", "default_decision")),
    )


def watch_thresholds(overrides: CanaryOverrides | None) -> Thresholds:
    """The watch's thresholds: the code's, each the tenant sets replaced by the tenant's
    (a name `Thresholds` does not have is left out: the admin API refuses one)."""
    own = (overrides or {}).get("watch") or {}
    names = {f.name: f.type for f in dataclasses.fields(Thresholds)}
    chosen = {
        name: int(value) if names[name] in ("int", int) else float(value)
        for name, value in own.items()
        if name in names
    }
    return dataclasses.replace(Thresholds(), **chosen)


def _source(tenant: str | None, own: CanaryOverrides, keys: tuple[str, ...]) -> str:
    if tenant is None:
        return "the learner's settings"
    mine = [key for key in keys if key in own]
    if not mine:
        return "the learner's settings"
    return f"tenant {tenant}'s {', '.join(mine)}, else the learner's"
