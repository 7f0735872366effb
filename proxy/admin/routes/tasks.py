"""Tasks: the reference answers graders compare against (list, load, delete).

Loading validates every task with the task-file parser (store/tasks.py) before
anything is written; a change bumps the "tasks_revision" state, on which a running learner
reloads its table from the store (learner/control.py).
"""

from __future__ import annotations

import json
from typing import Annotated, TypedDict

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy import Connection

from proxy.admin.deps import EngineDep
from proxy.admin.errors import AdminError, not_found
from proxy.admin.schemas import TaskKeyText, TasksIn
from store import learner_state
from store import tasks as task_store
from store.control import TASKS_REVISION_KEY
from store.json_types import JsonObject
from store.tasks import Task as TaskSpec
from store.tasks import TaskColumns, TaskStats, TaskTableError, parse_task, upsert_tasks

router = APIRouter(tags=["tasks"])
TaskKey = Annotated[TaskKeyText, Path()]


class TaskView(TypedDict):
    key: str
    prompt: str | None
    answer: str | None
    match: str
    tolerance: float
    metadata: JsonObject | None
    grader: str | None
    setup: str | None
    check: str | None
    trajectories: int
    mean_reward: float | None


class TaskList(TypedDict):
    items: list[TaskView]
    next_after: str | None  # None: the last page


class Loaded(TypedDict):
    loaded: int
    keys: list[str]  # the first 1000


def _row(task: TaskColumns, stats: TaskStats) -> TaskView:
    return {
        "key": task["key"],
        "prompt": task["prompt"],
        "answer": task["answer"],
        "match": task["match"],
        "tolerance": task["tolerance"],
        "metadata": task["metadata"],
        "grader": task.get("grader"),
        "setup": task.get("setup"),
        "check": task.get("check"),
        "trajectories": stats.get("trajectories", 0),
        "mean_reward": stats.get("mean_reward"),
    }


def _bump(conn: Connection) -> None:
    # an object, not a bare number: SQLite's JSON column affinity turns "1" into 1 (not JSON)
    state = learner_state.get_state(conn, TASKS_REVISION_KEY)
    revision = state.get("revision", 0) if isinstance(state, dict) else 0
    learner_state.set_state(conn, TASKS_REVISION_KEY, {"revision": revision + 1})


@router.get(
    "/tasks",
    summary="List tasks, by key",
    response_model=dict,  # serialised as returned (TaskList)
)
def list_tasks(
    engine: EngineDep,
    after: Annotated[TaskKeyText | None, Query(description="last key of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> TaskList:
    with engine.connect() as conn:
        rows = task_store.list_tasks(conn, after=after, limit=limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        stats = task_store.task_stats(conn, [r["key"] for r in rows])
    return {
        "items": [_row(r, stats.get(r["key"], {})) for r in rows],
        "next_after": rows[-1]["key"] if more else None,
    }


def _parse(body: TasksIn) -> list[TaskSpec]:
    if body.jsonl is not None:
        lines = [(f"jsonl line {n}", line) for n, line in enumerate(body.jsonl.splitlines(), 1)]
    else:
        lines = [(f"tasks[{i}]", json.dumps(t)) for i, t in enumerate(body.tasks or [])]
    out: dict[str, TaskSpec] = {}
    try:
        for where, line in lines:
            if not line.strip():
                continue
            task = parse_task(line, where=where)
            if task.key in out:
                raise TaskTableError(f"{where}: field 'id': duplicate task id {task.key!r}")
            if len(task.key) > 500:
                raise TaskTableError(f"{where}: field 'id': longer than 500 characters")
            out[task.key] = task
    except TaskTableError as exc:
        raise AdminError(400, str(exc), param="tasks") from None
    if not out:
        raise AdminError(400, "no tasks given", param="tasks")
    return list(out.values())


@router.post(
    "/tasks",
    status_code=201,
    summary="Load (add or replace) tasks",
    response_model=dict,  # serialised as returned (Loaded)
)
def load_tasks(engine: EngineDep, body: TasksIn) -> Loaded:
    """Objects like the lines of a task file: {"id", "prompt"?, "answer"?, "match"?,
    "tolerance"?, "metadata"?, "grader"?, "setup"?, "check"?}. All are checked first; one
    bad task loads none."""
    tasks = _parse(body)
    rows = [t.row() for t in tasks]  # every column, the rollout's setup/check/grader too
    with engine.begin() as conn:
        upsert_tasks(conn, rows)
        _bump(conn)
    return {"loaded": len(rows), "keys": [r["key"] for r in rows][:1000]}


@router.get(
    "/tasks/{key:path}",
    summary="One task",
    response_model=dict,  # serialised as returned (TaskView)
)
def get_task(engine: EngineDep, key: TaskKey) -> TaskView:
    with engine.connect() as conn:
        row = task_store.task_row(conn, key)
        if row is None:
            raise not_found("task", key)
        return _row(row, task_store.task_stats(conn, [key]).get(key, {}))


@router.delete("/tasks/{key:path}", status_code=204, summary="Delete a task")
def delete_task(engine: EngineDep, key: TaskKey) -> Response:
    with engine.begin() as conn:
        if not task_store.delete_task(conn, key):
            raise not_found("task", key)
        _bump(conn)
    return Response(status_code=204)
