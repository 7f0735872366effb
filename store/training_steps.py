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


def add_step(conn: Connection, *, step: int, version: str | None, metrics: dict[str, Any]) -> None:
    conn.execute(
        insert_for(conn, TrainingStep.__table__).values(
            step=step, version=version, created_at=now(), metrics=metrics
        )
    )
