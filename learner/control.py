"""Operator control of a running learner, through the store (the admin API writes it).

LearnerState keys: "control" (written by operators: pause, live knobs), "tasks_revision"
(bumped by operators when they load or delete tasks: the learner then reloads its task table
from the store) and "learner" (the learner's heartbeat: what it applied, its step, what it
is doing, when it last reported). Invariant: the learner reads the first two once per loop
iteration and never writes them; operators never write the heartbeat.

A knob's effective value is the one set last: by an operator (the time is stored with it)
or by the learner's own settings (command line, environment, config file), which count as
set when they differ from the previous run's. So a live change survives restarts and
reloads of the trainer, and a restart with a new `--learning-rate` takes effect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypedDict

from sqlalchemy import Connection

from store import grade_queue
from store.control import (
    HEARTBEAT_KEY,
    KNOBS,
    TASKS_REVISION_KEY,
    Control,
    read_control,
)
from store.learner_state import get_state, set_state
from store.tasks import task_table

if TYPE_CHECKING:
    from learner.accounting import LastBatch
    from learner.loop.state import LoopState


class Knobs(TypedDict, total=False):
    """The knobs an operator can turn (store.control.KNOBS), by name."""

    learning_rate: float
    batch_trajectories: int
    max_batch_trajectories: int
    max_staleness: int
    fresh_wait: float


class HeartbeatRecord(TypedDict):
    """What the learner says of itself every few seconds (HEARTBEAT_KEY): the dashboard,
    `onthejob status`, the curriculum runner and the next learner read it."""

    at: str  # ISO time
    paused: bool
    activity: str
    step: int
    serving: str | None  # the shared policy's version
    learning_rate: float
    batch_trajectories: int
    max_batch_trajectories: int
    max_staleness: int
    fresh_wait: float
    poll_interval: float
    own: Knobs  # as the learner's command line set them
    own_set_at: dict[str, str]
    last_batch: LastBatch | None


log = logging.getLogger("onthejob.learner")


def follow(learner: LoopState) -> bool:
    """Apply the operator's knobs to the learner's state and report in; True while paused
    (after waiting one poll interval, so the caller can simply `continue`)."""
    with learner.engine.begin() as conn:
        control = read_control(conn)
        _apply(learner, control)
        _follow_tasks(learner, conn)
        learner.applied_control = control
        set_state(conn, HEARTBEAT_KEY, heartbeat(learner))
    if control.paused:
        learner.activity = "paused"
        time.sleep(learner.config.poll_interval)
    return control.paused


def own_set_at(own: Knobs, previous: HeartbeatRecord | None) -> dict[str, str]:
    """When each of the learner's own knobs was set: now if it differs from the previous
    run's (someone changed the command line), else when that run said it was set."""
    previous = previous or {}
    before = previous.get("own") if isinstance(previous.get("own"), dict) else None
    stamps = previous.get("own_set_at") if isinstance(previous.get("own_set_at"), dict) else {}
    now = datetime.now(UTC).isoformat()
    out: dict[str, str] = {}
    for name, value in own.items():
        if before is not None and name in before and before[name] != value:
            out[name] = now
        elif isinstance(stamps.get(name), str):
            out[name] = stamps[name]
    return out


def effective_knobs(own: Knobs, own_stamps: dict[str, str], control: Control) -> Knobs:
    """Each knob as it was set last: the operator's value unless the learner's own setting
    is newer (ties go to the operator). Knobs missing from `own` are left out."""
    wanted: Knobs = {}
    for name in (n for n in KNOBS if n in own):
        operator = getattr(control, name)
        newer_own = own_stamps.get(name, "") > control.set_at.get(name, "")
        wanted[name] = own[name] if operator is None or newer_own else operator
    return wanted


def _apply(learner: LoopState, control: Control) -> None:
    """Set each knob to its effective value (the operator's, or the learner's own)."""
    config = learner.config
    wanted = effective_knobs(learner.own_knobs, learner.own_set_at, control)
    if wanted["learning_rate"] != config.learning_rate:
        config.learning_rate = wanted["learning_rate"]
        learner.trainer_config = dataclasses.replace(
            learner.trainer_config, learning_rate=config.learning_rate
        )
        if learner.shared.trainer is not None:
            learner.shared.trainer.set_learning_rate(config.learning_rate)
    config.batch_trajectories = wanted["batch_trajectories"]
    config.max_batch_trajectories = wanted["max_batch_trajectories"]
    config.fresh_wait = learner.shared.fresh.limit_seconds = wanted["fresh_wait"]
    if wanted["max_staleness"] != config.max_staleness:
        config.max_staleness = wanted["max_staleness"]
        learner.grouping = dataclasses.replace(learner.grouping, max_staleness=config.max_staleness)


def _follow_tasks(learner: LoopState, conn: Connection) -> None:
    state = get_state(conn, TASKS_REVISION_KEY)
    revision = state.get("revision") if isinstance(state, dict) else None
    if revision is None or revision == learner.tasks_revision:
        return
    learner.tasks = task_table(conn)
    learner.tasks_revision = revision
    grade_queue.retry_failed_now(conn)  # a grading that lacked its task may succeed now
    log.info("task table reloaded from the store: %d tasks", len(learner.tasks))


def heartbeat(learner: LoopState) -> HeartbeatRecord:
    config = learner.config
    control = learner.applied_control
    serving = learner.shared.serving  # the shared policy's (tenants have their own)
    return {
        "at": datetime.now(UTC).isoformat(),
        "paused": control.paused,
        "activity": learner.activity,
        "step": learner.step,
        "serving": None if serving is None else serving["version"],
        "learning_rate": config.learning_rate,
        "batch_trajectories": config.batch_trajectories,
        "max_batch_trajectories": config.max_batch_trajectories,
        "max_staleness": config.max_staleness,
        "fresh_wait": config.fresh_wait,
        "poll_interval": config.poll_interval,
        "own": learner.own_knobs,
        "own_set_at": learner.own_set_at,
        # the last batch a step took: what it trained on and dropped, by reason (also when
        # it had nothing to train on, which records no step)
        "last_batch": learner.last_batch,
    }


class Heartbeat:
    """Reports the learner alive from a thread of its own, so a long step, swap or grading
    round does not make it look stopped."""

    def __init__(self, learner: LoopState) -> None:
        self.learner = learner
        # well within the admin API's "stopped" threshold (15 s, or 5 poll intervals)
        self.every = min(5.0, max(learner.config.poll_interval, 0.5))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            with contextlib.suppress(Exception):  # the store is away: the loop says why
                with self.learner.engine.begin() as conn:
                    set_state(conn, HEARTBEAT_KEY, heartbeat(self.learner))
