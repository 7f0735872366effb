"""The regression guard's records (torch-free: the admin API reads and writes them too).

They live in learner_state (no table of its own), under these keys:
- `guard.evals`: per checkpoint path (a rollback label shares its version's checkpoint, so
  its scores carry over), per type, the last eval of those weights;
- `guard.decisions`: every decision, newest last (at most MAX_DECISIONS);
- `guard.waiver`: the operator's waiver for the next version (consumed by it);
- `guard.protected`: types an operator pinned as protected (or unpinned), over the file;
- `guard.config`: what the running learner guards with (shown by the admin API).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Select, select

from store import policy_versions
from store.json_types import JsonObject
from store.learner_state import get_state, set_state
from store.models import Grade, Trajectory

EVALS, DECISIONS, WAIVER, PROTECTED, CONFIG = (
    "guard.evals", "guard.decisions", "guard.waiver", "guard.protected", "guard.config",
)  # fmt: skip
MAX_DECISIONS = 500


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def decisions(conn: Connection) -> list[JsonObject]:
    """Every decision, oldest first: open JSON, as the learner (learner/guard_run.py) or an
    operator's acceptance (the admin API) recorded it."""
    return list(get_state(conn, DECISIONS) or [])


def guard_decision(conn: Connection, version: str) -> JsonObject:
    """The latest decision on `version` (KeyError: none)."""
    for entry in reversed(decisions(conn)):
        if entry.get("version") == version:
            return entry
    raise KeyError(version)


def append_decision(conn: Connection, entry: JsonObject) -> None:
    set_state(conn, DECISIONS, [*decisions(conn), entry][-MAX_DECISIONS:])


def protected_overrides(conn: Connection) -> dict[str, bool]:
    value = get_state(conn, PROTECTED) or {}
    return {str(k): bool(v) for k, v in value.items()}


def mark_rolled_back(conn: Connection, *, version: str, serving: str, decision: JsonObject) -> None:
    """The rejected version: status rolled_back, why, and the decision in its metrics (the
    dashboard and the versions API show them)."""
    row = policy_versions.version(conn, version=version)
    if row is None:
        return
    metrics = dict(row["metrics"] or {})
    metrics["guard"] = {**decision, "serving_after": serving}
    policy_versions.set_version_outcome(
        conn,
        version=version,
        status="rolled_back",
        error=f"regression guard: {decision['reason']}",
        metrics=metrics,
    )


def trained_types(conn: Connection, step: int | None) -> list[str]:
    """The interaction types of the trajectories a step trained on."""
    if step is None:
        return []
    return _types(
        conn,
        select(Trajectory.interaction_type)
        .join(Grade, Grade.trajectory_id == Trajectory.id)
        .where(Grade.trained_in_step == step),
    )


def recorded_types(conn: Connection, trajectory_ids: list[str]) -> list[str]:
    """The interaction types these trajectories were recorded as."""
    if not trajectory_ids:
        return []
    return _types(
        conn, select(Trajectory.interaction_type).where(Trajectory.id.in_(trajectory_ids))
    )


def _types(conn: Connection, query: Select[Any]) -> list[str]:
    """The distinct interaction types `query` selects, sorted (untyped ones left out)."""
    rows = conn.execute(query.distinct())
    return sorted(str(t) for (t,) in rows if t is not None)
