"""The curriculum tables: where each curriculum stands, its evals and its promotions.

Written by the curriculum runner (learner/rollout/curriculum_runner.py), read by it when it
resumes and by the admin API (proxy/admin/routes/curricula.py). Callers own the
transaction. Invariant: a promotion row and the curriculum's move to the next stage are
written together (`promote`), so the recorded stage is always the last promotion's
`to_stage` (or the first stage, before any).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict, cast

from sqlalchemy import Connection, insert, select, update

from store.clock import now
from store.json_types import JsonObject
from store.models import Curriculum as CurriculumRow
from store.models import CurriculumEval, CurriculumPromotion


class CurriculumError(ValueError):
    """A curriculum file that cannot be used; the message names file, stage and field."""


class RuleState(TypedDict):
    """A stage's promotion rule as the store keeps it (learner/rollout/curriculum.py's)."""

    metric: str
    at_least: float
    over_last: int


class StageState(TypedDict):
    """A stage as the store keeps it (learner/rollout/curriculum.py writes it; the admin API
    shows it)."""

    name: str
    rule: RuleState
    replay: float
    train_tasks: int
    eval_tasks: int


class CurriculumState(TypedDict):
    """A curriculum's row: where it stands."""

    name: str
    path: str | None
    stages: list[StageState]
    stage: str | None  # None: every stage passed
    stage_index: int | None
    stage_since: datetime
    stage_rounds: int
    last_eval_round: int | None
    rounds: int
    started_at: datetime
    updated_at: datetime
    completed_at: datetime | None


class EvalRow(TypedDict):
    """One eval of a stage (`id`: once read back)."""

    id: NotRequired[int]
    curriculum: str
    stage: str
    rollout_id: str
    policy_version: str | None
    stage_round: int
    runs: int
    k: int
    pass_at_1: float | None
    mean_reward: float | None
    pass_at_k: float | None
    created_at: datetime


class PromotionRow(TypedDict):
    """A promotion (`id`: once read back); `to_stage` None: the last stage was passed."""

    id: NotRequired[int]
    curriculum: str
    from_stage: str
    to_stage: str | None
    policy_version: str | None
    metrics: JsonObject
    created_at: datetime


class _Stage(Protocol):
    name: str
    index: int


class CurriculumFile(Protocol):
    """What `begin` reads of a loaded curriculum (learner/rollout/curriculum.Curriculum)."""

    name: str
    path: Path

    @property
    def stages(self) -> Sequence[_Stage]: ...

    def stage(self, name: str) -> _Stage | None: ...

    def state(self) -> list[StageState]: ...


class _Changes(TypedDict, total=False):
    path: str
    stages: list[StageState]
    stage_index: int


def begin(conn: Connection, curriculum: CurriculumFile) -> CurriculumState:
    """The curriculum's recorded state, made at its first stage if it has none. The stages
    kept are the file's; a recorded stage the file no longer has is a CurriculumError."""
    table = CurriculumRow.__table__
    row = conn.execute(select(table).where(table.c.name == curriculum.name)).first()
    at = now()
    if row is None:
        first = curriculum.stages[0]
        values: CurriculumState = {
            "name": curriculum.name,
            "path": str(curriculum.path),
            "stages": curriculum.state(),
            "stage": first.name,
            "stage_index": 0,
            "stage_since": at,
            "stage_rounds": 0,
            "last_eval_round": None,
            "rounds": 0,
            "started_at": at,
            "updated_at": at,
            "completed_at": None,
        }
        conn.execute(insert(table).values(**values))
        return values
    state = cast(CurriculumState, dict(row._mapping))
    changes: _Changes = {"path": str(curriculum.path), "stages": curriculum.state()}
    if state["stage"] is not None:
        stage = curriculum.stage(state["stage"])
        if stage is None:
            names = ", ".join(repr(s.name) for s in curriculum.stages)
            raise CurriculumError(
                f"{curriculum.path}: curriculum {curriculum.name!r} is recorded at stage "
                f"{state['stage']!r}, which this file does not have (its stages: {names})"
            )
        changes["stage_index"] = stage.index  # stages may have been added before it
    conn.execute(update(table).where(table.c.name == curriculum.name).values(**changes))
    state.update(changes)
    return state


def state(conn: Connection, name: str) -> CurriculumState | None:
    table = CurriculumRow.__table__
    row = conn.execute(select(table).where(table.c.name == name)).first()
    return None if row is None else cast(CurriculumState, dict(row._mapping))


def record_round(conn: Connection, name: str) -> None:
    table = CurriculumRow.__table__
    conn.execute(
        update(table)
        .where(table.c.name == name)
        .values(rounds=table.c.rounds + 1, stage_rounds=table.c.stage_rounds + 1, updated_at=now())
    )


def record_eval(conn: Connection, name: str, **values: Any) -> EvalRow:
    """An eval of the current stage (`stage`, `stage_round`, `rollout_id`, metrics...)."""
    row = cast(EvalRow, {"curriculum": name, "created_at": now(), **values})
    conn.execute(insert(CurriculumEval).values(**row))
    table = CurriculumRow.__table__
    conn.execute(
        update(table)
        .where(table.c.name == name)
        .values(last_eval_round=values["stage_round"], updated_at=row["created_at"])
    )
    return row


def stage_evals(conn: Connection, name: str, stage: str, *, since: datetime) -> list[EvalRow]:
    """The stage's evals since it became the current stage, oldest first."""
    table = CurriculumEval.__table__
    rows = conn.execute(
        select(table)
        .where(table.c.curriculum == name, table.c.stage == stage, table.c.created_at >= since)
        .order_by(table.c.id)
    )
    return [cast(EvalRow, dict(r._mapping)) for r in rows]


def promote(
    conn: Connection,
    name: str,
    *,
    from_stage: str,
    to_stage: str | None,
    to_index: int | None,
    policy_version: str | None,
    metrics: JsonObject,
) -> PromotionRow:
    """Record a promotion and move the curriculum to `to_stage` (None: completed)."""
    at = now()
    row: PromotionRow = {
        "curriculum": name,
        "from_stage": from_stage,
        "to_stage": to_stage,
        "policy_version": policy_version,
        "metrics": metrics,
        "created_at": at,
    }
    conn.execute(insert(CurriculumPromotion).values(**row))
    table = CurriculumRow.__table__
    conn.execute(
        update(table)
        .where(table.c.name == name)
        .values(
            stage=to_stage,
            stage_index=to_index,
            stage_since=at,
            stage_rounds=0,
            last_eval_round=None,
            updated_at=at,
            completed_at=at if to_stage is None else None,
        )
    )
    return row


def curricula(conn: Connection) -> list[CurriculumState]:
    """Every curriculum's state, the most recently active first."""
    table = CurriculumRow.__table__
    rows = conn.execute(select(table).order_by(table.c.updated_at.desc(), table.c.name))
    return [cast(CurriculumState, dict(r._mapping)) for r in rows]


def promotions(conn: Connection, name: str | None = None) -> list[PromotionRow]:
    """Promotions, oldest first (of one curriculum, or of all)."""
    table = CurriculumPromotion.__table__
    query = select(table).order_by(table.c.id)
    if name is not None:
        query = query.where(table.c.curriculum == name)
    return [cast(PromotionRow, dict(r._mapping)) for r in conn.execute(query)]


def evals(conn: Connection, name: str, *, limit: int = 1000) -> list[EvalRow]:
    """The curriculum's latest `limit` evals (every stage), oldest first."""
    table = CurriculumEval.__table__
    rows = conn.execute(
        select(table).where(table.c.curriculum == name).order_by(table.c.id.desc()).limit(limit)
    )
    return [cast(EvalRow, dict(r._mapping)) for r in reversed(rows.all())]
