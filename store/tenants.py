"""Tenants in the store: defined and changed by an operator (the admin API), read by every
proxy to route calls, and by the learner to train each tenant's adapter on its own traffic.

A client key or an interaction type belongs to one tenant at most: `put_tenant` refuses one
that another tenant lists (TenantConflict), so a call's tenant never depends on the order
the tenants were read in. Callers own the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection, delete, func, select, true, update

from store import policy_versions
from store.models import Call, Grade, PolicyVersion, Tenant, Trajectory


class CanaryOverrides(TypedDict, total=False):
    """A tenant's own canary settings, each over the learner's `--canary-*` (left out: the
    learner's); learner/canary/settings.py resolves them."""

    share: float  # of the tenant's sessions a new version serves first; 0: no canary
    min_calls: int  # per arm, before any decision
    time_limit_s: float  # then the default decision
    default_decision: str  # promote | rollback
    watch: dict[str, float]  # the reward-hacking watch's thresholds (watch.py Thresholds)


class TenantRow(TypedDict):
    name: str
    client_keys: list[str]
    interaction_types: list[str]
    serving_version: str | None  # None: the shared policy answers its calls
    created_at: datetime
    updated_at: datetime
    canary: CanaryOverrides | None  # None: the learner's canary settings


class VersionTraffic(TypedDict):
    version: str | None
    trajectories: int
    mean_reward: float | None


class TenantTraffic(TypedDict):
    """A tenant's graded trajectories, how many a step trained on, per serving version."""

    graded: int
    trained: int
    by_version: list[VersionTraffic]


@dataclass(frozen=True)
class TenantRule:
    """What the proxy needs of a tenant to route its calls."""

    name: str
    client_keys: tuple[str, ...]
    interaction_types: tuple[str, ...]
    serving_version: str | None


class TenantConflict(ValueError):
    """A key or type the new definition lists is another tenant's."""

    def __init__(self, field: str, value: str, owner: str) -> None:
        super().__init__(f"{field} {value!r} already belongs to tenant {owner!r}")
        self.field, self.value, self.owner = field, value, owner


def rules(conn: Connection) -> list[TenantRule]:
    """Every tenant, by name."""
    rows = conn.execute(
        select(
            Tenant.name, Tenant.client_keys, Tenant.interaction_types, Tenant.serving_version
        ).order_by(Tenant.name)
    )
    return [
        TenantRule(name, tuple(keys or ()), tuple(types or ()), serving)
        for name, keys, types, serving in rows
    ]


def list_tenants(conn: Connection, name: str | None = None) -> list[TenantRow]:
    """Every tenant by name (or the one named), with when it was made and last changed."""
    query = select(Tenant.__table__).order_by(Tenant.name)
    if name is not None:
        query = query.where(Tenant.name == name)
    rows = [dict(row._mapping) for row in conn.execute(query)]
    for row in rows:
        row["client_keys"] = list(row["client_keys"] or ())
        row["interaction_types"] = list(row["interaction_types"] or ())
    return cast(list[TenantRow], rows)


def get_tenant(conn: Connection, name: str) -> TenantRow | None:
    found = list_tenants(conn, name)
    return found[0] if found else None


def put_tenant(
    conn: Connection,
    *,
    name: str,
    client_keys: list[str],
    interaction_types: list[str],
    now: datetime,
) -> bool:
    """Create the tenant, or replace what it lists (its serving version stays); True when
    created. Raises TenantConflict when another tenant lists one of its keys or types."""
    others = [rule for rule in rules(conn) if rule.name != name]
    for rule in others:
        for key in client_keys:
            if key in rule.client_keys:
                raise TenantConflict("client key", key, rule.name)
        for kind in interaction_types:
            if kind in rule.interaction_types:
                raise TenantConflict("interaction type", kind, rule.name)
    listed = {"client_keys": client_keys, "interaction_types": interaction_types}
    changed = conn.execute(
        update(Tenant).where(Tenant.name == name).values(**listed, updated_at=now)
    )
    if changed.rowcount:
        return False
    conn.execute(
        Tenant.__table__.insert().values(
            name=name, **listed, serving_version=None, created_at=now, updated_at=now
        )
    )
    return True


def set_serving(conn: Connection, *, name: str, version: str | None, now: datetime) -> bool:
    """Point the tenant's calls at `version` (None: the shared policy); False: no tenant."""
    changed = conn.execute(
        update(Tenant).where(Tenant.name == name).values(serving_version=version, updated_at=now)
    )
    return bool(changed.rowcount)


def set_canary(
    conn: Connection, *, name: str, overrides: CanaryOverrides | None, now: datetime
) -> bool:
    """The tenant's own canary settings (None or empty: the learner's); False: no tenant."""
    changed = conn.execute(
        update(Tenant).where(Tenant.name == name).values(canary=overrides or None, updated_at=now)
    )
    return bool(changed.rowcount)


def canary_overrides(conn: Connection, name: str) -> CanaryOverrides | None:
    """The tenant's own canary settings; None: none (or no such tenant)."""
    found = conn.execute(select(Tenant.canary).where(Tenant.name == name)).scalar()
    return cast(CanaryOverrides, found) if found else None


def steered_by_hand(pointer: str | None, lineage_serving: str | None) -> bool:
    """Whether a tenant's pointer (what the proxies send its calls to) is not what its
    lineage serves: its recorded serving version, or the shared policy (None) before it has
    one. Only an operator moves it so (`PUT /admin/api/tenants/NAME/serving`); the learner's
    publishes, the guard and `onthejob rollback` move both together. The learner leaves
    such a tenant alone (learner/loop/tenants.py)."""
    return pointer != lineage_serving


def delete_tenant(conn: Connection, name: str) -> bool:
    """Its calls go to the shared policy from now on; the calls it made keep its name. Its
    lineage serves nothing any more: a tenant defined again under the name starts afresh,
    instead of finding an old version serving that its new pointer does not name (which
    reads as an operator's hand, and the learner would leave it alone)."""
    found = bool(conn.execute(delete(Tenant).where(Tenant.name == name)).rowcount)
    if found:
        policy_versions.supersede_serving(conn, name)
    return found


def orphaned_versions(conn: Connection, versions: Iterable[str]) -> set[str]:
    """Those of `versions` that belong to a tenant no longer defined: a deleted tenant's
    adapters, which nothing routes to any more (the shared policy's are never among them)."""
    names = set(versions)
    if not names:
        return set()
    rows = conn.execute(
        select(PolicyVersion.version).where(
            PolicyVersion.version.in_(names),
            PolicyVersion.tenant.is_not(None),
            PolicyVersion.tenant.not_in(select(Tenant.name)),
        )
    )
    return {version for (version,) in rows}


def tenant_stats(conn: Connection, name: str | None = None) -> dict[str, TenantTraffic]:
    """Per tenant (by the tenant of a trajectory's first call): its graded trajectories, how
    many a step trained on, and per version that served them (the version of the first
    call, in the order versions served; never-verified labels first) their count and mean
    reward: the tenant's reward over its own versions. `name`: that tenant's only."""
    first = (
        select(Call.tenant, Call.policy_version)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at)
        .limit(1)
        .correlate(Trajectory)
    )
    tenant = first.with_only_columns(Call.tenant).scalar_subquery()
    version = first.with_only_columns(Call.policy_version).scalar_subquery()
    rows = conn.execute(
        select(
            tenant.label("tenant"),
            version.label("version"),
            func.count().label("graded"),
            func.count(Grade.trained_in_step).label("trained"),
            func.avg(Grade.reward).label("mean_reward"),
        )
        .select_from(Grade)
        .join(Trajectory, Trajectory.id == Grade.trajectory_id)
        .where(Grade.reward.is_not(None), true() if name is None else tenant == name)
        .group_by(tenant, version)
    ).all()
    ordinals = {v: o for v, o in conn.execute(select(PolicyVersion.version, PolicyVersion.ordinal))}
    out: dict[str, TenantTraffic] = {}
    for row in rows:
        if row.tenant is None:
            continue
        stats = out.setdefault(row.tenant, {"graded": 0, "trained": 0, "by_version": []})
        stats["graded"] += row.graded
        stats["trained"] += row.trained
        stats["by_version"].append(
            {
                "version": row.version,
                "trajectories": row.graded,
                "mean_reward": None if row.mean_reward is None else float(row.mean_reward),
            }
        )
    for stats in out.values():
        stats["by_version"].sort(
            key=lambda v: (ordinals.get(v["version"]) is not None, ordinals.get(v["version"]) or 0)
        )
    return out
