"""Operator control of a running learner, as the store holds it (the admin API writes it,
the learner follows it: learner/control.py).

LearnerState keys: "control" (written by operators: pause, live knobs), "tasks_revision"
(bumped by operators when they load or delete tasks: the learner then reloads its task table
from the store) and "learner" (the learner's heartbeat: what it applied, its step, what it
is doing, when it last reported). Invariant: the learner reads the first two once per loop
iteration and never writes them; operators never write the heartbeat.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict, cast

from sqlalchemy import Connection

from store.json_types import JsonObject
from store.learner_state import get_state, set_state

CONTROL_KEY = "control"
HEARTBEAT_KEY = "learner"
TASKS_REVISION_KEY = "tasks_revision"
KNOBS = (
    "learning_rate",
    "batch_trajectories",
    "max_batch_trajectories",
    "max_staleness",
    "fresh_wait",
)


class ControlState(TypedDict):
    """Control as the store keeps it (`Control.state`)."""

    paused: bool
    learning_rate: float | None
    batch_trajectories: int | None
    max_batch_trajectories: int | None
    max_staleness: int | None
    fresh_wait: float | None
    set_at: dict[str, str]  # knob -> ISO time it was set


@dataclass(frozen=True)
class Control:
    """What operators asked for; None means 'as the learner was started'."""

    paused: bool = False
    learning_rate: float | None = None
    batch_trajectories: int | None = None
    max_batch_trajectories: int | None = None  # 0: no bound
    max_staleness: int | None = None
    fresh_wait: float | None = None  # seconds; 0: train at once
    set_at: dict[str, str] = field(default_factory=dict)  # knob -> ISO time it was set

    def __post_init__(self) -> None:
        if self.learning_rate is not None and not (
            math.isfinite(self.learning_rate) and 0 < self.learning_rate <= 1
        ):
            raise ValueError("learning_rate must be in (0, 1]")
        if self.batch_trajectories is not None and not 1 <= self.batch_trajectories <= 100_000:
            raise ValueError("batch_trajectories must be between 1 and 100000")
        if self.max_batch_trajectories is not None and not (
            0 <= self.max_batch_trajectories <= 100_000
        ):
            raise ValueError("max_batch_trajectories must be between 0 (no bound) and 100000")
        if self.max_staleness is not None and not 0 <= self.max_staleness <= 1_000_000:
            raise ValueError("max_staleness must be between 0 and 1000000")
        if self.fresh_wait is not None and not (
            math.isfinite(self.fresh_wait) and 0 <= self.fresh_wait <= 86_400
        ):
            raise ValueError("fresh_wait must be between 0 (no wait) and 86400 seconds")
        if not isinstance(self.set_at, dict):
            raise ValueError("set_at must map knobs to times")

    def changed(self, **knobs: Any) -> Control:
        """These knobs set now (None: back to the learner's own setting)."""
        stamp = datetime.now(UTC).isoformat()
        set_at = dict(self.set_at)
        for name, value in knobs.items():
            if value is None:
                set_at.pop(name, None)
            else:
                set_at[name] = stamp
        return dataclasses.replace(self, **knobs, set_at=set_at)

    @classmethod
    def from_state(cls, value: Any) -> Control:
        if not isinstance(value, dict):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in value.items() if k in names})
        except (TypeError, ValueError):
            return cls()  # a hand-edited row must not stop the learner

    def state(self) -> ControlState:
        return cast(ControlState, dataclasses.asdict(self))


def read_control(conn: Connection) -> Control:
    return Control.from_state(get_state(conn, CONTROL_KEY))


def write_control(conn: Connection, control: Control) -> None:
    set_state(conn, CONTROL_KEY, control.state())


def read_heartbeat(conn: Connection) -> JsonObject | None:
    """The learner's heartbeat (open JSON: what learner/control.py reports)."""
    value = get_state(conn, HEARTBEAT_KEY)
    return value if isinstance(value, dict) else None
