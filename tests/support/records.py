"""Reading what the proxy recorded, from the test's side."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, func, select

from store.export import iter_trajectories
from store.models import Call


def count_calls(engine: Engine, **where: Any) -> int:
    query = select(func.count()).select_from(Call)
    for name, value in where.items():
        query = query.where(getattr(Call, name) == value)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def wait_for_calls(engine: Engine, n: int, timeout: float = 30.0, **where: Any) -> None:
    """Poll (bounded) until at least n calls matching `where` are in the database."""
    deadline = time.monotonic() + timeout
    while (have := count_calls(engine, **where)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {have} of {n} calls recorded after {timeout}s")
        time.sleep(0.05)


def export(engine: Engine, **filters: Any) -> list[dict[str, Any]]:
    return list(iter_trajectories(engine, **filters))


def all_calls(engine: Engine) -> list[dict[str, Any]]:
    return [c for t in export(engine) for c in t["calls"]]


def served_calls(tid: str, versions: list[str], at: float) -> list[dict[str, Any]]:
    """The calls of `tid`, one per version in `versions`, a second apart from `at`."""
    return [
        {
            "id": f"{tid}-{i}",
            "trajectory_id": tid,
            "session_key": None,
            "api": "chat.completions",
            "status": "ok",
            "http_status": 200,
            "stream": False,
            "prompt_prefix_len": 0,
            "capture_complete": True,
            "started_at": at + i,
            "policy_version": version,
        }
        for i, version in enumerate(versions)
    ]
