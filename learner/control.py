"""Operator control of a running learner, through the store (the admin API writes it).

LearnerState keys: "control" (written by operators: pause, live knobs), "tasks_revision"
(bumped by operators when they load or delete tasks: the learner then reloads its task table
from the store) and "learner" (the learner's heartbeat: what it applied, its step, when it
last looked). Invariant: the learner reads the first two once per loop iteration and never
writes them; operators never write the heartbeat.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select

from learner import queries
from learner.graders.tasks import Task as TaskSpec
from learner.graders.tasks import TaskTable
from proxy.store.models import Task

if TYPE_CHECKING:
    from learner.loop import Learner

log = logging.getLogger("onthejob.learner")

CONTROL_KEY = "control"
HEARTBEAT_KEY = "learner"
TASKS_REVISION_KEY = "tasks_revision"
KNOBS = ("learning_rate", "batch_trajectories", "max_staleness")


@dataclass(frozen=True)
class Control:
    """What operators asked for; None means 'as the learner was started'."""

    paused: bool = False
    learning_rate: float | None = None
    batch_trajectories: int | None = None
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        if self.learning_rate is not None and not (
            math.isfinite(self.learning_rate) and 0 < self.learning_rate <= 1
        ):
            raise ValueError("learning_rate must be in (0, 1]")
        if self.batch_trajectories is not None and not 1 <= self.batch_trajectories <= 100_000:
            raise ValueError("batch_trajectories must be between 1 and 100000")
        if self.max_staleness is not None and not 0 <= self.max_staleness <= 1_000_000:
            raise ValueError("max_staleness must be between 0 and 1000000")

    @classmethod
    def from_state(cls, value: Any) -> Control:
        if not isinstance(value, dict):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in value.items() if k in names})
        except (TypeError, ValueError):
            return cls()  # a hand-edited row must not stop the learner

    def state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_control(conn: Connection) -> Control:
    return Control.from_state(queries.get_state(conn, CONTROL_KEY))


def write_control(conn: Connection, control: Control) -> None:
    queries.set_state(conn, CONTROL_KEY, control.state())


def read_heartbeat(conn: Connection) -> dict[str, Any] | None:
    value = queries.get_state(conn, HEARTBEAT_KEY)
    return value if isinstance(value, dict) else None


def follow(learner: Learner) -> bool:
    """Apply the operator's knobs to `learner` and report in; True while paused (after
    waiting one poll interval, so the caller can simply `continue`)."""
    with learner.engine.begin() as conn:
        control = read_control(conn)
        _apply(learner, control)
        _follow_tasks(learner, conn)
        queries.set_state(conn, HEARTBEAT_KEY, _heartbeat(learner, control))
    if control.paused:
        time.sleep(learner.config.poll_interval)
    return control.paused


def _apply(learner: Learner, control: Control) -> None:
    """Set each knob to the operator's value, or back to the learner's own when cleared."""
    config = learner.config
    own = getattr(learner, "_own_knobs", None)
    if own is None:
        own = {name: getattr(config, name) for name in KNOBS}
        learner._own_knobs = own  # type: ignore[attr-defined]
    wanted = {
        name: own[name] if getattr(control, name) is None else getattr(control, name)
        for name in KNOBS
    }
    if wanted["learning_rate"] != config.learning_rate:
        config.learning_rate = wanted["learning_rate"]
        learner.trainer_config = dataclasses.replace(
            learner.trainer_config, learning_rate=config.learning_rate
        )
        if learner.trainer is not None:
            learner.trainer.set_learning_rate(config.learning_rate)
    config.batch_trajectories = wanted["batch_trajectories"]
    if wanted["max_staleness"] != config.max_staleness:
        config.max_staleness = wanted["max_staleness"]
        learner.grouping = dataclasses.replace(learner.grouping, max_staleness=config.max_staleness)


def _follow_tasks(learner: Learner, conn: Connection) -> None:
    state = queries.get_state(conn, TASKS_REVISION_KEY)
    revision = state.get("revision") if isinstance(state, dict) else None
    if revision is None or revision == getattr(learner, "_tasks_revision", None):
        return
    rows = conn.execute(select(Task.__table__)).mappings()
    learner.tasks = TaskTable(
        {
            row["key"]: TaskSpec(
                key=row["key"],
                prompt=row["prompt"],
                answer=row["answer"],
                match=row["match"],
                tolerance=row["tolerance"],
                metadata=row["metadata"] or {},
            )
            for row in rows
        }
    )
    learner._tasks_revision = revision  # type: ignore[attr-defined]
    log.info("task table reloaded from the store: %d tasks", len(learner.tasks))


def _heartbeat(learner: Learner, control: Control) -> dict[str, Any]:
    config = learner.config
    return {
        "at": datetime.now(UTC).isoformat(),
        "paused": control.paused,
        "step": learner.step,
        "serving": None if learner.serving is None else learner.serving["version"],
        "learning_rate": config.learning_rate,
        "batch_trajectories": config.batch_trajectories,
        "max_staleness": config.max_staleness,
        "poll_interval": config.poll_interval,
    }
