"""The regression guard's file and its decision rule (pure: no I/O besides reading the file).

`onthejob learn --guard FILE` evaluates every new policy version on the eval task set of
each guarded interaction type before the version is kept (learner/guard_run.py runs the
evals). This module says what a regression is.

The rule, per type: `drop = before - after` of the type's metric (pass@1 by default), where
`before` is the last kept version's eval and `after` the new version's. The eval is noisy:
n tasks x k samples is a binomial estimate with sd sqrt(p(1-p)/(nk)), so the difference of
two evals has sd sqrt(pb(1-pb)/Nb + pa(1-pa)/Na). The `noise` floor is `z` (default 2) of
those sd's; a margin below it would roll back at random (about 2% of versions at z = 2 for
a version that changed nothing). So:
- an unprotected type regressed when `drop > max(margin, noise)` (margin default 0.10);
- a protected type regressed when `drop > noise` (zero tolerance beyond the eval's noise),
  and also when it could not be evaluated at all.
Any regressed type rolls the version back, whatever type it trained on, unless an
operator's waiver covers it: a waiver lets the next version through for the types it names,
or, naming none, for every unprotected type (a protected type must be named).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from learner.rollout.taskset import TaskSet, load_task_set
from store.json_types import JsonObject

METRICS = ("pass_at_1", "mean_reward")
DEFAULT_MARGIN = 0.10
DEFAULT_Z = 2.0


class GuardFileError(ValueError):
    """The guard file is not valid; the message names the setting."""


@dataclass(frozen=True)
class GuardedType:
    name: str
    tasks: TaskSet  # the eval set: a task set in the rollout format
    command: list[str]  # the harness that runs them (as `onthejob rollout` runs one)
    samples: int = 4  # runs per task (k)
    margin: float = DEFAULT_MARGIN
    protected: bool = False
    metric: str = "pass_at_1"
    success_threshold: float = 1.0
    timeout: float = 120.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return len(self.tasks.tasks) * self.samples


@dataclass(frozen=True)
class TenantGuard:
    """A tenant's own eval sets, the shared types its versions must pass too, and the
    environment its evals run with (its client key or type, so its adapter answers them)."""

    types: list[GuardedType]
    shared: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GuardConfig:
    proxy_url: str  # evals run through the proxy, so their calls are recorded like any
    types: list[GuardedType]  # the shared policy's; a tenant's `shared` names some of them
    z: float = DEFAULT_Z
    concurrency: int = 4
    tenants: dict[str, TenantGuard] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> GuardConfig | None:
        """What judges a tenant's versions (learn --tenants): its own types and the shared
        ones it names, each run with the tenant's environment; None: it has no entry."""
        entry = self.tenants.get(tenant)
        if entry is None:
            return None
        shared = [t for t in self.types if t.name in entry.shared]
        types = [
            dataclasses.replace(t, env={**t.env, **entry.env}) for t in [*entry.types, *shared]
        ]
        return dataclasses.replace(self, types=types, tenants={})

    @classmethod
    def load(cls, path: Path) -> GuardConfig:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise GuardFileError(f"{path}: {exc}") from None
        return cls.parse(data, base=path.parent, where=str(path))

    @classmethod
    def parse(cls, data: JsonObject, *, base: Path, where: str = "guard") -> GuardConfig:
        unknown = sorted(set(data) - {"proxy", "z", "concurrency", "command", "types", "tenants"})
        if unknown:
            raise GuardFileError(f"{where}: unknown settings {', '.join(unknown)}")
        if not isinstance(data.get("proxy"), str):
            raise GuardFileError(f"{where}: proxy (the onthejob proxy's URL) is required")
        types = data.get("types", {})
        tenants = data.get("tenants", {})
        if not isinstance(types, dict) or not isinstance(tenants, dict):
            raise GuardFileError(f"{where}: types and tenants must be tables")
        if not types and not tenants:
            raise GuardFileError(f"{where}: no [types.NAME] nor [tenants.NAME] tables")
        z = float(data.get("z", DEFAULT_Z))
        if z < 0:
            raise GuardFileError(f"{where}: z must not be negative")
        default_command = data.get("command")
        parsed = [
            _parse_type(name, spec, base, default_command, f"{where}: types.{name}")
            for name, spec in types.items()
        ]
        return cls(
            proxy_url=data["proxy"],
            types=parsed,
            z=z,
            concurrency=int(data.get("concurrency", 4)),
            tenants={
                name: _parse_tenant(
                    spec, set(types), base, default_command, f"{where}: tenants.{name}"
                )
                for name, spec in tenants.items()
            },
        )


def _parse_tenant(
    spec: Any, shared_names: set[str], base: Path, default_command: Any, where: str
) -> TenantGuard:
    if not isinstance(spec, dict):
        raise GuardFileError(f"{where}: must be a table")
    unknown = sorted(set(spec) - {"types", "shared", "env"})
    if unknown:
        raise GuardFileError(f"{where}: unknown settings {', '.join(unknown)}")
    own = spec.get("types", {})
    shared = spec.get("shared", [])
    if not isinstance(own, dict) or not (
        isinstance(shared, list) and all(isinstance(n, str) for n in shared)
    ):
        raise GuardFileError(f"{where}: types must be tables, shared a list of type names")
    if not own and not shared:
        raise GuardFileError(f"{where}: no [{where.split(': ')[-1]}.types.NAME] and no shared")
    missing = sorted(set(shared) - shared_names)
    if missing:
        raise GuardFileError(f"{where}: shared names {', '.join(missing)}, not in [types]")
    clash = sorted(set(own) & set(shared))
    if clash:
        raise GuardFileError(f"{where}: {', '.join(clash)} is both its own and shared")
    env = spec.get("env", {})
    if not isinstance(env, dict):
        raise GuardFileError(f"{where}: env must be a table")
    return TenantGuard(
        types=[
            _parse_type(name, t, base, default_command, f"{where}.types.{name}")
            for name, t in own.items()
        ],
        shared=list(shared),
        env={str(k): str(v) for k, v in env.items()},
    )


_TYPE_KEYS = {
    "tasks", "command", "samples", "margin", "protected", "metric", "success_threshold",
    "timeout", "env",
}  # fmt: skip


def _parse_type(name: str, spec: Any, base: Path, default_command: Any, where: str) -> GuardedType:
    if not isinstance(spec, dict):
        raise GuardFileError(f"{where}: must be a table")
    unknown = sorted(set(spec) - _TYPE_KEYS)
    if unknown:
        raise GuardFileError(f"{where}: unknown settings {', '.join(unknown)}")
    if "tasks" not in spec:
        raise GuardFileError(f"{where}: tasks (the eval task set) is required")
    command = spec.get("command", default_command)
    if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
        raise GuardFileError(f"{where}: command must be a list of strings (or set one on top)")
    metric = spec.get("metric", "pass_at_1")
    if metric not in METRICS:
        raise GuardFileError(f"{where}: metric must be one of {', '.join(METRICS)}")
    margin = float(spec.get("margin", DEFAULT_MARGIN))
    samples = int(spec.get("samples", 4))
    if margin < 0 or samples < 1:
        raise GuardFileError(f"{where}: margin must be >= 0 and samples >= 1")
    path = Path(spec["tasks"])
    try:
        tasks = load_task_set(path if path.is_absolute() else base / path, name=f"guard:{name}")
    except (OSError, ValueError) as exc:
        raise GuardFileError(f"{where}: {exc}") from None
    return GuardedType(
        name=name,
        tasks=tasks,
        command=list(command),
        samples=samples,
        margin=margin,
        protected=bool(spec.get("protected", False)),
        metric=metric,
        success_threshold=float(spec.get("success_threshold", 1.0)),
        timeout=float(spec.get("timeout", 120.0)),
        env={str(k): str(v) for k, v in dict(spec.get("env", {})).items()},
    )


class ScoreState(TypedDict):
    value: float
    runs: int


class WaiverState(TypedDict):
    types: list[str] | None  # None: every type that is not protected
    reason: str


class VerdictState(TypedDict):
    """A `TypeVerdict` as the guard's records and the dashboard show it."""

    type: str
    protected: bool
    metric: str
    before: ScoreState | None
    after: ScoreState | None
    drop: float | None
    allowed: float | None
    regressed: bool
    waived: bool
    note: str


class GuardedTypeState(TypedDict):
    type: str
    tasks: int
    samples: int
    runs: int
    margin: float
    protected: bool
    metric: str


class TenantGuardState(TypedDict):
    types: list[GuardedTypeState]
    shared: list[str]


class GuardConfigState(TypedDict):
    """What `config_state` says of a guard's configuration."""

    proxy: str
    z: float
    types: list[GuardedTypeState]
    tenants: dict[str, TenantGuardState]


@dataclass(frozen=True)
class Score:
    """One eval of one type by one version: the metric's value over `runs` graded runs."""

    value: float
    runs: int


def noise(before: Score, after: Score, z: float) -> float:
    """z sd's of the difference of two evals (binomial; for a mean reward in [0, 1] the
    Bernoulli variance at its mean bounds the true one from above)."""

    def var(s: Score) -> float:
        p = min(max(s.value, 0.0), 1.0)
        return p * (1 - p) / max(s.runs, 1)

    return z * math.sqrt(var(before) + var(after))


def worst_case_noise(runs: int, z: float) -> float:
    """The floor at p = 0.5 for two evals of `runs` each: what a margin must clear to mean
    anything at every p."""
    return z * math.sqrt(2 * 0.25 / max(runs, 1))


@dataclass(frozen=True)
class Waiver:
    """An operator lets the next version through: for `types`, or (None) every unprotected
    type."""

    types: list[str] | None = None
    reason: str = ""

    def covers(self, guarded: GuardedType) -> bool:
        if self.types is None:
            return not guarded.protected
        return guarded.name in self.types

    def state(self) -> WaiverState:
        return {"types": self.types, "reason": self.reason}

    @classmethod
    def from_state(cls, value: Any) -> Waiver | None:
        if not isinstance(value, dict):
            return None
        types = value.get("types")
        return cls(types=None if types is None else [str(t) for t in types],
                   reason=str(value.get("reason", "")))  # fmt: skip


@dataclass(frozen=True)
class TypeVerdict:
    type: str
    protected: bool
    metric: str
    before: Score | None
    after: Score | None
    allowed: float | None  # the drop it may take: max(margin, noise), or noise if protected
    regressed: bool
    waived: bool
    note: str = ""

    @property
    def drop(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.before.value - self.after.value

    def state(self) -> VerdictState:
        def score(s: Score | None) -> ScoreState | None:
            return None if s is None else {"value": s.value, "runs": s.runs}

        return {
            "type": self.type,
            "protected": self.protected,
            "metric": self.metric,
            "before": score(self.before),
            "after": score(self.after),
            "drop": self.drop,
            "allowed": self.allowed,
            "regressed": self.regressed,
            "waived": self.waived,
            "note": self.note,
        }


@dataclass(frozen=True)
class Decision:
    outcome: str  # kept | rolled_back | waived
    verdicts: list[TypeVerdict]

    @property
    def reason(self) -> str:
        bad = [v for v in self.verdicts if v.regressed and not v.waived]
        if not bad:
            waived = [v.type for v in self.verdicts if v.waived]
            return f"waived for {', '.join(waived)}" if waived else "no guarded type regressed"
        return "; ".join(_describe(v) for v in bad)


def _describe(v: TypeVerdict) -> str:
    if v.before is None or v.after is None:
        return f"{v.type} (protected): {v.note or 'not evaluated'}"
    return (
        f"{v.type}{' (protected)' if v.protected else ''} {v.metric} "
        f"{v.before.value:.3f} -> {v.after.value:.3f} (drop {v.drop:.3f} > allowed "
        f"{v.allowed:.3f})"
    )


def decide(
    config: GuardConfig,
    before: dict[str, Score],
    after: dict[str, Score],
    waiver: Waiver | None = None,
) -> Decision:
    """Keep, roll back or (waiver) let through a version, from its evals and the last kept
    version's. A type without both evals is skipped, unless it is protected."""
    verdicts = [_verdict(t, before.get(t.name), after.get(t.name), config.z, waiver)
                for t in config.types]  # fmt: skip
    regressed = [v for v in verdicts if v.regressed]
    if not regressed:
        return Decision("kept", verdicts)
    if all(v.waived for v in regressed):
        return Decision("waived", verdicts)
    return Decision("rolled_back", verdicts)


def _verdict(
    guarded: GuardedType,
    before: Score | None,
    after: Score | None,
    z: float,
    waiver: Waiver | None,
) -> TypeVerdict:
    waived = waiver is not None and waiver.covers(guarded)
    common = {"type": guarded.name, "protected": guarded.protected, "metric": guarded.metric}
    if before is None or after is None or not before.runs or not after.runs:
        # a protected type must be shown not to regress; others are skipped
        note = "no eval of the last kept version" if not before or not before.runs else ""
        note = note or "the new version's eval had no graded runs"
        return TypeVerdict(**common, before=before, after=after, allowed=None,
                           regressed=guarded.protected, waived=waived and guarded.protected,
                           note=note)  # fmt: skip
    floor = noise(before, after, z)
    allowed = floor if guarded.protected else max(guarded.margin, floor)
    regressed = before.value - after.value > allowed
    return TypeVerdict(**common, before=before, after=after, allowed=allowed,
                       regressed=regressed, waived=waived and regressed)  # fmt: skip


def config_state(config: GuardConfig) -> GuardConfigState:
    def types(guarded: list[GuardedType]) -> list[GuardedTypeState]:
        return [
            {"type": t.name, "tasks": len(t.tasks.tasks), "samples": t.samples, "runs": t.runs,
             "margin": t.margin, "protected": t.protected, "metric": t.metric}
            for t in guarded
        ]  # fmt: skip

    return {
        "proxy": config.proxy_url,
        "z": config.z,
        "types": types(config.types),
        "tenants": {
            name: {"types": types(entry.types), "shared": entry.shared}
            for name, entry in config.tenants.items()
        },
    }
