"""Client keys: create (the key is shown once), list, revoke (proxy/base/keys.py).

A change takes effect at once in this proxy and within `key_poll_interval` seconds in every
other proxy on the same store. Only the key's SHA-256 is stored; no answer but the one that
creates a key ever contains it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, TypedDict

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy.exc import IntegrityError

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.schemas import ClientKeyIn, KeyName
from proxy.base import keys
from store import keys as store
from store.clock import iso
from store.keys import KeyRow

router = APIRouter(tags=["keys"])


class KeyView(TypedDict):
    name: str
    id: str
    created_at: str | None
    revoked_at: str | None


class KeyList(TypedDict):
    required: bool  # whether calls need a key
    items: list[KeyView]


class NewKey(TypedDict):
    name: str
    id: str
    key: str  # shown this once
    created_at: str | None


def _row(row: KeyRow) -> KeyView:
    return {
        "name": row["name"],
        "id": row["id"],
        "created_at": iso(row["created_at"]),
        "revoked_at": iso(row["revoked_at"]),
    }


@router.get(
    "/keys",
    summary="List client keys (never the keys themselves)",
    response_model=dict,  # serialised as returned (KeyList)
)
def list_keys(
    engine: EngineDep,
    state: StateDep,
    revoked: Annotated[bool, Query(description="also list revoked keys")] = False,
) -> KeyList:
    with engine.connect() as conn:
        rows = store.list_keys(conn, include_revoked=revoked)
    return {"required": state.keys.required, "items": [_row(r) for r in rows]}


@router.post(
    "/keys",
    status_code=201,
    summary="Create a client key (shown once)",
    response_model=dict,  # serialised as returned (NewKey)
)
def create_key(engine: EngineDep, state: StateDep, body: ClientKeyIn) -> NewKey:
    """The answer holds the key; the store keeps only its SHA-256, so it cannot be shown
    again. Clients send it as `Authorization: Bearer <key>` or `x-api-key: <key>`; every call
    made with it records `name`. 409 while `name` has a key that is not revoked."""
    key_id, key, key_digest = keys.new_key()
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            store.add_key(conn, key_id=key_id, name=body.name, digest=key_digest, now=now)
    except IntegrityError:
        raise AdminError(
            409, f"{body.name!r} already has a key: revoke it first", param="name"
        ) from None
    state.keys.added(key_id, body.name, key_digest)
    return {"name": body.name, "id": key_id, "key": key, "created_at": iso(now)}


@router.delete("/keys/{name}", status_code=204, summary="Revoke a client key")
def revoke_key(engine: EngineDep, state: StateDep, name: Annotated[KeyName, Path()]) -> Response:
    """Calls with it are refused from now on (401); the calls it made keep its name."""
    with engine.begin() as conn:
        key_id = store.revoke_key(conn, name=name, now=datetime.now(UTC))
    if key_id is None:
        raise not_found("client key", name)
    state.keys.revoked(key_id)
    return Response(status_code=204)
