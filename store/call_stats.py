"""Calls in a window, by harness (User-Agent) and client API, with what the compatibility
policy did to each (the admin API's compat view: proxy/admin/compat.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from store.models import Call


def calls_by_agent_and_api(
    conn: Connection, *, since: datetime, until: datetime
) -> list[tuple[str | None, str, int]]:
    """(user agent, api, calls) for the calls started in [since, until)."""
    rows = conn.execute(
        select(Call.user_agent, Call.api, func.count())
        .where(Call.started_at >= since, Call.started_at < until)
        .group_by(Call.user_agent, Call.api)
    )
    return [(agent, api, int(n)) for agent, api, n in rows]


def compat_records(
    conn: Connection, *, since: datetime, until: datetime, apis: Sequence[str]
) -> Iterator[tuple[str | None, Any]]:
    """(user agent, compat record) of the calls of `apis` started in [since, until), newest
    first, streamed (a long window holds many)."""
    rows = conn.execute(
        select(Call.user_agent, Call.compat)
        .where(Call.started_at >= since, Call.started_at < until, Call.api.in_(apis))
        .order_by(Call.started_at.desc())
        .execution_options(yield_per=1000)
    )
    yield from ((user_agent, compat) for user_agent, compat in rows)
