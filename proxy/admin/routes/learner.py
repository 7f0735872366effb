"""The learner: status, pause/resume, live knobs. Operators write the "control" state;
the learner applies it once per loop iteration and answers with a heartbeat
(learner/control.py)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any, TypedDict, cast

from fastapi import APIRouter
from sqlalchemy import Connection

from proxy.admin.deps import EngineDep, StateDep
from proxy.admin.schemas import KnobsIn
from store import gates, grade_queue, policy_versions, training_steps
from store.clock import iso
from store.control import (
    KNOBS,
    Control,
    ControlState,
    read_control,
    read_heartbeat,
    write_control,
)
from store.json_types import JsonObject

router = APIRouter(tags=["learner"])
ALIVE_POLLS = 5  # a heartbeat older than this many poll intervals (at least 15 s): stopped


class Queue(TypedDict):
    open: int
    ungraded_finished: int
    graded_untrained: int
    grading_retrying: int
    grading_failed: int


class LastStep(TypedDict):
    step: int
    version: str | None
    created_at: str | None
    metrics: JsonObject
    tenant: str | None


class LearnerStatus(TypedDict):
    state: str  # running | paused | stopped | never_seen
    pause_requested: bool
    control: ControlState
    heartbeat: JsonObject | None
    heartbeat_age_s: float | None
    last_step: LastStep | None
    serving: str | None
    queue: Queue
    fenced: list[str]  # replicas held for a weight swap
    fanout: int


def _age(heartbeat: JsonObject | None) -> float | None:
    if not heartbeat or not isinstance(heartbeat.get("at"), str):
        return None
    try:
        at = datetime.fromisoformat(heartbeat["at"])
    except ValueError:
        return None
    return (datetime.now(UTC) - at).total_seconds()


def _queue(conn: Connection) -> Queue:
    failures = grade_queue.grading_failures(conn)
    return {
        "open": grade_queue.count_open(conn),
        "ungraded_finished": grade_queue.count_ungraded_finished(conn),
        "graded_untrained": grade_queue.count_graded_untrained(conn),
        # gradings that failed: to be tried again, or for good (`onthejob regrade`)
        "grading_retrying": failures["retrying"],
        "grading_failed": failures["failed"],
    }


def _last_step(conn: Connection) -> LastStep | None:
    step = training_steps.latest_step(conn)
    if step is not None:
        cast(LastStep, step)["created_at"] = iso(step["created_at"])
    return cast(LastStep | None, step)


def status(conn: Connection, fanout: int) -> LearnerStatus:
    control = read_control(conn)
    heartbeat = read_heartbeat(conn)
    age = _age(heartbeat)
    poll = float((heartbeat or {}).get("poll_interval") or 1.0)
    alive = age is not None and age < max(15.0, ALIVE_POLLS * poll)
    if not alive:
        state = "stopped" if heartbeat else "never_seen"
    else:
        state = "paused" if (heartbeat or {}).get("paused") else "running"
    serving = policy_versions.serving_version(conn)
    return {
        "state": state,
        "pause_requested": control.paused,
        "control": control.state(),
        "heartbeat": heartbeat,
        "heartbeat_age_s": age,
        "last_step": _last_step(conn),
        "serving": None if serving is None else serving["version"],
        "queue": _queue(conn),
        # replicas held for a weight swap: a publish in progress, or one that must be redone
        "fenced": sorted(g["upstream"] for g in gates.closed_gates(conn)),
        "fanout": fanout,
    }


@router.get(
    "/learner",
    summary="Learner status, queue and knobs",
    response_model=dict,  # serialised as returned (LearnerStatus)
)
def get_status(engine: EngineDep, state: StateDep) -> LearnerStatus:
    """`state`: running, paused, stopped (no heartbeat lately) or never_seen."""
    with engine.connect() as conn:
        return status(conn, state.settings.fanout)


def _set(engine: Any, **changes: Any) -> Control:
    """Knobs are stamped with the time they were set: the learner takes the newer of an
    operator's value and its own command line (learner/control.py)."""
    knobs = {name: value for name, value in changes.items() if name in KNOBS}
    others = {name: value for name, value in changes.items() if name not in KNOBS}
    with engine.begin() as conn:
        control = read_control(conn)
        control = dataclasses.replace(control.changed(**knobs), **others)
        write_control(conn, control)
    return control


@router.post(
    "/learner/pause",
    summary="Pause learning (grading and training)",
    response_model=dict,  # serialised as returned (LearnerStatus)
)
def pause(engine: EngineDep, state: StateDep) -> LearnerStatus:
    _set(engine, paused=True)
    return get_status(engine, state)


@router.post(
    "/learner/resume",
    summary="Resume learning",
    response_model=dict,  # serialised as returned (LearnerStatus)
)
def resume(engine: EngineDep, state: StateDep) -> LearnerStatus:
    _set(engine, paused=False)
    return get_status(engine, state)


@router.patch(
    "/learner/knobs",
    summary="Change knobs live",
    response_model=dict,  # serialised as returned (LearnerStatus)
)
def knobs(engine: EngineDep, state: StateDep, body: KnobsIn) -> LearnerStatus:
    """Only the fields sent change; null returns a knob to the learner's own setting.
    `fanout` is this proxy's (applied at once); the others the learner applies at its next
    iteration."""
    sent = body.model_dump(exclude_unset=True)
    if "fanout" in sent:
        fanout = sent.pop("fanout")
        state.settings.fanout = 1 if fanout is None else fanout
    if sent:
        _set(engine, **sent)
    return get_status(engine, state)
