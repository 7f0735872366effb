"""The learner's optimizer steps and what each measured."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from store.clock import now
from store.db import insert_for
from store.models import (
    TrainingStep,
)


def last_step(conn: Connection) -> int:
    value = conn.execute(select(func.max(TrainingStep.step))).scalar()
    return 0 if value is None else int(value)


def add_step(
    conn: Connection,
    *,
    step: int,
    version: str | None,
    metrics: dict[str, Any],
    tenant: str | None = None,
) -> None:
    """`tenant`: whose adapter the step trained (None: the shared policy)."""
    conn.execute(
        insert_for(conn, TrainingStep.__table__).values(
            step=step, version=version, created_at=now(), metrics=metrics, tenant=tenant
        )
    )
