"""The learner's optimizer steps and what each measured."""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection, func, select

from store.clock import now
from store.db import insert_for
from store.json_types import JsonObject
from store.models import (
    TrainingStep,
)


class StepRow(TypedDict):
    """A recorded optimizer step."""

    step: int
    version: str | None  # the version it published; None: not published
    created_at: datetime
    metrics: JsonObject  # what the step measured (learner/loop/step.py)
    tenant: str | None  # whose adapter it trained; None: the shared policy


def step_count(conn: Connection) -> int:
    """How many steps are recorded (published or not)."""
    return int(conn.execute(select(func.count()).select_from(TrainingStep)).scalar() or 0)


def metrics_by_version(conn: Connection) -> dict[str | None, JsonObject | None]:
    """Each recorded step's metrics, by the version it published (None: not published)."""
    rows = conn.execute(select(TrainingStep.version, TrainingStep.metrics))
    return {row.version: row.metrics for row in rows}


def latest_step(conn: Connection) -> StepRow | None:
    """The newest recorded step's row, None before the first."""
    row = conn.execute(
        select(TrainingStep.__table__).order_by(TrainingStep.step.desc()).limit(1)
    ).first()
    return None if row is None else cast(StepRow, dict(row._mapping))


def last_step(conn: Connection) -> int:
    value = conn.execute(select(func.max(TrainingStep.step))).scalar()
    return 0 if value is None else int(value)


def add_step(
    conn: Connection,
    *,
    step: int,
    version: str | None,
    metrics: JsonObject,
    tenant: str | None = None,
) -> None:
    """`tenant`: whose adapter the step trained (None: the shared policy)."""
    conn.execute(
        insert_for(conn, TrainingStep.__table__).values(
            step=step, version=version, created_at=now(), metrics=metrics, tenant=tenant
        )
    )
