"""Policy versions: what serves, their order (ordinals), outcomes, probes, checkpoints and
pins. Callers own the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select, update

from store.clock import now
from store.db import insert_for
from store.models import (
    PolicyVersion,
)


def version_ordinals(conn: Connection) -> dict[str, int]:
    """The verified versions' places in the staleness order (failed versions have none)."""
    rows = conn.execute(
        select(PolicyVersion.version, PolicyVersion.ordinal).where(
            PolicyVersion.ordinal.is_not(None)
        )
    )
    return {version: ordinal for version, ordinal in rows}


def serving_version(conn: Connection) -> dict[str, Any] | None:
    row = conn.execute(
        select(PolicyVersion.__table__)
        .where(PolicyVersion.status == "serving")
        .order_by(PolicyVersion.ordinal.desc())
        .limit(1)
    ).first()
    return None if row is None else dict(row._mapping)


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
    metrics: dict[str, Any] | None = None,
    probe: dict[str, Any] | None = None,
) -> None:
    """`ordinal`: None for a version that failed verification (it never served anyone).
    Callers hold the publish lease (learner/swap/lease.py), so the ordinal they read is theirs."""
    if status == "serving":
        _supersede_serving(conn)
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
        )
    )


def set_version_probe(conn: Connection, *, version: str, probe: dict[str, Any]) -> None:
    conn.execute(update(PolicyVersion).where(PolicyVersion.version == version).values(probe=probe))


def _supersede_serving(conn: Connection) -> None:
    """Only one version serves at a time."""
    conn.execute(
        update(PolicyVersion).where(PolicyVersion.status == "serving").values(status="superseded")
    )


def set_version_status(conn: Connection, *, version: str, status: str) -> None:
    if status == "serving":
        _supersede_serving(conn)
    conn.execute(
        update(PolicyVersion).where(PolicyVersion.version == version).values(status=status)
    )


def set_version_outcome(
    conn: Connection, *, version: str, status: str, error: str | None, metrics: dict[str, Any]
) -> None:
    """A version taken out of service after it served (the regression guard)."""
    if status == "serving":
        raise ValueError("use set_version_status to serve a version")
    conn.execute(
        update(PolicyVersion)
        .where(PolicyVersion.version == version)
        .values(status=status, error=error, metrics=metrics)
    )


def version(conn: Connection, *, version: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(PolicyVersion.__table__).where(PolicyVersion.version == version)
    ).first()
    return None if row is None else dict(row._mapping)


def versions_with_checkpoints(conn: Connection) -> list[dict[str, Any]]:
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
        ).where(PolicyVersion.checkpoint_path.is_not(None))
    )
    return [dict(r._mapping) for r in rows]


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
    target: dict[str, Any] | None, current: dict[str, Any] | None, name: str, action: str
) -> None:
    """Refuse what `action` (rollback or promote) cannot serve: `target` is the version
    `name`'s row, `current` the serving one's."""
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
