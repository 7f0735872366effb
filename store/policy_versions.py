"""Policy versions: what serves, their order (ordinals), outcomes, probes, checkpoints and
pins. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict, cast

from sqlalchemy import Connection, func, select, update

from store.clock import now
from store.db import insert_for
from store.json_types import JsonObject
from store.models import (
    Call,
    PolicyVersion,
)

# a verified version that serves a canary's share of its scope, not the scope
CANARY = "canary"


class CheckpointVersion(TypedDict):
    """What checkpoint retention decides a version's checkpoint by."""

    version: str
    ordinal: int | None  # None: it failed verification
    parent: str | None
    status: str
    checkpoint_path: str | None
    pinned: bool
    checkpoint_deleted_at: datetime | None
    tenant: str | None  # its lineage: None for the shared policy's


class PolicyVersionRow(CheckpointVersion):
    """A row of policy_versions."""

    created_at: datetime
    swap_seconds: float | None
    error: str | None
    metrics: JsonObject | None  # the learner's figures for it
    probe: JsonObject | None  # what its verification probe found


def version_ordinals(conn: Connection) -> dict[str, int]:
    """The verified versions' places in the staleness order (failed versions have none)."""
    rows = conn.execute(
        select(PolicyVersion.version, PolicyVersion.ordinal).where(
            PolicyVersion.ordinal.is_not(None)
        )
    )
    return {version: ordinal for version, ordinal in rows}


def lineage_ordinals(conn: Connection, tenant: str) -> dict[str, int]:
    """A tenant's staleness order: its verified versions 1, 2, ... in the order they served,
    and every verified version of the shared policy 0 (what served its calls before its
    first adapter). Global ordinals would count the other tenants' steps as its own."""
    rows = conn.execute(
        select(PolicyVersion.version, PolicyVersion.tenant)
        .where(
            PolicyVersion.ordinal.is_not(None),
            PolicyVersion.tenant.is_(None) | (PolicyVersion.tenant == tenant),
        )
        .order_by(PolicyVersion.ordinal)
    )
    out: dict[str, int] = {}
    own = 0
    for version, owner in rows:
        own += owner is not None
        out[version] = 0 if owner is None else own
    return out


def lineage_newest_first(conn: Connection, tenant: str | None = None) -> list[str]:
    """The verified versions of one lineage (a tenant's, or None: the shared policy's),
    the newest first."""
    rows = conn.execute(
        select(PolicyVersion.version)
        .where(PolicyVersion.ordinal.is_not(None), _lineage(tenant))
        .order_by(PolicyVersion.ordinal.desc())
    )
    return [version for (version,) in rows]


def _lineage(tenant: str | None) -> Any:
    """The versions of one lineage: a tenant's adapters, or (None) the shared policy's."""
    return PolicyVersion.tenant.is_(None) if tenant is None else PolicyVersion.tenant == tenant


def serving_version(conn: Connection, tenant: str | None = None) -> PolicyVersionRow | None:
    """What serves the shared policy, or (`tenant`) that tenant's calls; one per lineage."""
    row = conn.execute(
        select(PolicyVersion.__table__)
        .where(PolicyVersion.status == "serving", _lineage(tenant))
        .order_by(PolicyVersion.ordinal.desc())
        .limit(1)
    ).first()
    return None if row is None else cast(PolicyVersionRow, dict(row._mapping))


def serving_name(conn: Connection, tenant: str | None = None) -> str | None:
    """The name of what serves the lineage (`serving_version`), None if nothing does."""
    serving = serving_version(conn, tenant)
    return None if serving is None else str(serving["version"])


def next_ordinal(conn: Connection) -> int:
    current = conn.execute(select(func.max(PolicyVersion.ordinal))).scalar()
    return 0 if current is None else int(current) + 1


def add_version(
    conn: Connection,
    *,
    version: str,
    ordinal: int | None,
    parent: str | None,
    checkpoint_path: str | None,
    status: str,
    swap_seconds: float | None = None,
    error: str | None = None,
    metrics: JsonObject | None = None,
    probe: JsonObject | None = None,
    tenant: str | None = None,
) -> None:
    """`ordinal`: None for a version that failed verification (it never served anyone).
    Callers hold the publish lease (learner/swap/lease.py), so the ordinal they read is theirs.
    `tenant`: the lineage it belongs to (None: the shared policy's)."""
    if status == "serving":
        supersede_serving(conn, tenant)
    conn.execute(
        insert_for(conn, PolicyVersion.__table__).values(
            version=version,
            ordinal=ordinal,
            parent=parent,
            checkpoint_path=checkpoint_path,
            created_at=now(),
            status=status,
            swap_seconds=swap_seconds,
            error=error,
            metrics=metrics,
            probe=probe,
            tenant=tenant,
        )
    )


def set_version_probe(conn: Connection, *, version: str, probe: JsonObject) -> None:
    conn.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(probe=probe))


def supersede_serving(conn: Connection, tenant: str | None) -> None:
    """Take the lineage's serving version out of service (only one serves at a time)."""
    conn.execute(
        update(PolicyVersion)
        .where(PolicyVersion.status == "serving", _lineage(tenant))
        .values(status="superseded")
    )


def set_version_status(conn: Connection, *, version: str, status: str) -> None:
    if status == "serving":
        lineage = conn.execute(
            select(PolicyVersion.tenant).where(PolicyVersion.version == version)
        ).scalar()
        supersede_serving(conn, lineage)
    conn.execute(
        update(PolicyVersion).where(PolicyVersion.version == version).values(status=status)
    )


def end_canary(conn: Connection, *, version: str, status: str) -> None:
    """A canary's candidate that the canary did not make serve (rolled back, or served
    under another name): `status` instead of CANARY. Any other status stays."""
    conn.execute(
        update(PolicyVersion)
        .where(PolicyVersion.version == version, PolicyVersion.status == CANARY)
        .values(status=status)
    )


def set_version_outcome(
    conn: Connection, *, version: str, status: str, error: str | None, metrics: JsonObject
) -> None:
    """A version taken out of service after it served (the regression guard)."""
    if status == "serving":
        raise ValueError("use set_version_status to serve a version")
    conn.execute(
        update(PolicyVersion)
        .where(PolicyVersion.version == version)
        .values(status=status, error=error, metrics=metrics)
    )


def version(conn: Connection, *, version: str) -> PolicyVersionRow | None:
    row = conn.execute(
        select(PolicyVersion.__table__).where(PolicyVersion.version == version)
    ).first()
    return None if row is None else cast(PolicyVersionRow, dict(row._mapping))


def newest_versions(conn: Connection, *, limit: int) -> list[PolicyVersionRow]:
    """The `limit` versions of highest ordinal, newest first (then those without one)."""
    rows = conn.execute(
        select(PolicyVersion.__table__).order_by(PolicyVersion.ordinal.desc()).limit(limit)
    )
    return [cast(PolicyVersionRow, dict(r._mapping)) for r in rows]


def calls_by_version(conn: Connection) -> dict[str | None, int]:
    """How many recorded calls each version served (None: before any version was known)."""
    rows = conn.execute(select(Call.policy_version, func.count()).group_by(Call.policy_version))
    return {version: int(n) for version, n in rows}


def versions_created_order(conn: Connection) -> list[PolicyVersionRow]:
    """Every version, in the order they were made (one that failed verification has no
    ordinal, so the ordinal cannot order them all)."""
    order = (PolicyVersion.created_at, PolicyVersion.version)
    rows = conn.execute(select(PolicyVersion.__table__).order_by(*order))
    return [cast(PolicyVersionRow, dict(row._mapping)) for row in rows]


def versions_with_checkpoints(conn: Connection) -> list[CheckpointVersion]:
    """Every version that names a checkpoint, with what retention decides by."""
    rows = conn.execute(
        select(
            PolicyVersion.version,
            PolicyVersion.ordinal,
            PolicyVersion.parent,
            PolicyVersion.status,
            PolicyVersion.checkpoint_path,
            PolicyVersion.pinned,
            PolicyVersion.checkpoint_deleted_at,
            PolicyVersion.tenant,
        ).where(PolicyVersion.checkpoint_path.is_not(None))
    )
    return [cast(CheckpointVersion, dict(r._mapping)) for r in rows]


def mark_checkpoints_deleted(conn: Connection, *, versions: Sequence[str]) -> set[str]:
    """Mark these versions' checkpoints deleted, but for any pinned meanwhile; the versions
    marked. One conditional update per version: a pin that commits first keeps its version,
    and a pin after the mark finds it deleted (`pin`), so neither needs a lock."""
    marked: set[str] = set()
    for name in versions:
        result = conn.execute(
            update(PolicyVersion)
            .where(
                PolicyVersion.version == name,
                PolicyVersion.pinned.is_(False),
                PolicyVersion.checkpoint_deleted_at.is_(None),
            )
            .values(checkpoint_deleted_at=now())
        )
        if result.rowcount == 1:
            marked.add(name)
    return marked


class VersionError(ValueError):
    """Why a version cannot be served or pinned; `status`: the admin API's HTTP status."""

    status = 409


class UnknownVersion(VersionError):
    status = 404


def pin(conn: Connection, *, version: str, pinned: bool) -> None:
    """Keep (or no longer keep) a version's checkpoint whatever retention would delete."""
    if pinned:
        result = conn.execute(
            update(PolicyVersion)
            .where(PolicyVersion.version == version, PolicyVersion.checkpoint_deleted_at.is_(None))
            .values(pinned=True)
        )
    else:
        result = conn.execute(
            update(PolicyVersion).where(PolicyVersion.version == version).values(pinned=False)
        )
    if result.rowcount == 1:
        return
    known = conn.execute(select(PolicyVersion.version).where(PolicyVersion.version == version))
    if known.first() is None:
        raise UnknownVersion(f"no policy version {version!r}")
    raise VersionError(f"version {version!r}: its checkpoint is deleted already")


def check_servable(
    target: PolicyVersionRow | None, current: PolicyVersionRow | None, name: str, action: str
) -> None:
    """Refuse what `action` (rollback or promote) cannot serve: `target` is the version
    `name`'s row, `current` the serving one's of the same lineage (a tenant's, or the shared
    policy's)."""
    if target is None:
        raise UnknownVersion(f"no policy version {name!r}")
    if not target["checkpoint_path"]:
        raise VersionError(f"version {name!r} has no checkpoint to serve")
    if target.get("checkpoint_deleted_at") is not None:
        raise VersionError(
            f"version {name!r}: checkpoint retention deleted its checkpoint (pin versions "
            "to keep them: `onthejob pin`)"
        )
    if target["ordinal"] is None:
        raise VersionError(f"version {name!r} failed verification; it cannot serve")
    if current is not None and current["version"] == name:
        raise VersionError(f"version {name!r} is already serving")
    if action == "rollback" and current is not None and target["ordinal"] > current["ordinal"]:
        raise VersionError(f"version {name!r} is newer than the serving one: promote it")
