"""Client keys in the store: created, listed, revoked; the proxy reads the active ones.

Only a key's SHA-256 is stored (proxy/base/keys.py makes and checks keys). Callers own the
transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection, select, update

from store.models import ClientKey


class KeyRow(TypedDict):
    """A client key as listed: never its digest."""

    id: str
    name: str
    created_at: datetime
    revoked_at: datetime | None


def add_key(conn: Connection, *, key_id: str, name: str, digest: str, now: datetime) -> None:
    """Raises IntegrityError when `name` already has an active key."""
    conn.execute(
        ClientKey.__table__.insert().values(
            id=key_id, name=name, digest=digest, created_at=now, revoked_at=None
        )
    )


def active_keys(conn: Connection) -> dict[str, tuple[str, str]]:
    """{key id: (name, digest)} of every key not revoked."""
    rows = conn.execute(
        select(ClientKey.id, ClientKey.name, ClientKey.digest).where(ClientKey.revoked_at.is_(None))
    )
    return {key_id: (name, digest) for key_id, name, digest in rows}


def list_keys(conn: Connection, *, include_revoked: bool) -> list[KeyRow]:
    """Newest first; never the digest."""
    query = select(ClientKey.id, ClientKey.name, ClientKey.created_at, ClientKey.revoked_at)
    if not include_revoked:
        query = query.where(ClientKey.revoked_at.is_(None))
    rows = conn.execute(query.order_by(ClientKey.created_at.desc(), ClientKey.id))
    return [cast(KeyRow, dict(r._mapping)) for r in rows]


def revoke_key(conn: Connection, *, name: str, now: datetime) -> str | None:
    """Revoke the active key named `name`; its id, or None when there is none."""
    key_id = conn.execute(
        select(ClientKey.id).where(ClientKey.name == name, ClientKey.revoked_at.is_(None))
    ).scalar()
    if key_id is None:
        return None
    conn.execute(update(ClientKey).where(ClientKey.id == key_id).values(revoked_at=now))
    return key_id
