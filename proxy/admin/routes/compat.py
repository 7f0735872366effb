"""Compatibility: what the proxy did with each harness's requests (proxy/admin/compat.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, TypedDict

from fastapi import APIRouter, Query

from proxy.admin import compat
from proxy.admin.compat import Harness
from proxy.admin.deps import EngineDep
from proxy.admin.errors import AdminError
from proxy.admin.schemas import CompatQuery
from store.clock import iso

router = APIRouter(tags=["compat"])


class Compat(TypedDict):
    since: str | None
    until: str | None
    harnesses: list[Harness]


@router.get(
    "/compat",
    summary="What the proxy accepted, honoured, left out or refused, per harness",
    response_model=dict,  # serialised as returned (Compat)
)
def get_compat(engine: EngineDep, query: Annotated[CompatQuery, Query()]) -> Compat:
    """Per harness (User-Agent) in [since, until), default the last 24 h: its calls by API,
    and for the translated APIs (Messages, Responses) the features the compatibility policy
    accepted without forwarding (`ignored`, `unknown`), `honoured`, `flattened`, `left_out`,
    `clamped` or `refused`, each with the number of calls it was in."""
    until = query.until or datetime.now(UTC)
    try:
        since = query.since or until - timedelta(hours=24)
    except OverflowError:
        raise AdminError(400, "until is out of range", param="until") from None
    if since >= until:
        raise AdminError(400, "since must be before until", param="since")
    with engine.connect() as conn:
        harnesses = compat.by_harness(conn, since=since, until=until)
    return {"since": iso(since), "until": iso(until), "harnesses": harnesses}
