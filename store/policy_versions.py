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


def mark_checkpoints_deleted(conn: Connection, *, versions: Sequence[str]) -> None:
    for start in range(0, len(versions), 500):
        conn.execute(
            update(PolicyVersion)
            .where(PolicyVersion.version.in_(list(versions[start : start + 500])))
            .values(checkpoint_deleted_at=now())
        )


def set_pinned(conn: Connection, *, version: str, pinned: bool) -> None:
    conn.execute(
        update(PolicyVersion).where(PolicyVersion.version == version).values(pinned=pinned)
    )
