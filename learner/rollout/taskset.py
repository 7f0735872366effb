"""Task sets: JSONL files of tasks for the rollout runner, and the task table they load into.

A task set is a `TaskTable` (store.tasks: one task a line, validated with errors
naming the line and field) plus a name (the file's stem unless given), which eval results
are filed under. Invariant: loading a task set twice leaves one row per task id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection

from store.tasks import TaskTable, TaskTableError, upsert_tasks

MAX_NAME = 200


@dataclass(frozen=True)
class TaskSet:
    name: str
    tasks: TaskTable


def load_task_set(path: str | Path, *, name: str | None = None) -> TaskSet:
    """A validated task set; TaskTableError (naming line and field) for a bad file."""
    path = Path(path)
    try:
        table = TaskTable.from_jsonl(path)
    except OSError as exc:
        raise TaskTableError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if not len(table):
        raise TaskTableError(f"{path}: no tasks")
    name = name or path.stem
    if not name or len(name) > MAX_NAME:
        raise TaskTableError(f"{path}: task set name must be 1-{MAX_NAME} characters")
    return TaskSet(name=name, tasks=table)


def store_tasks(conn: Connection, task_set: TaskSet) -> int:
    """Insert or update every task of the set in the task table; how many."""
    rows = [task.row() for task in task_set.tasks.values()]
    upsert_tasks(conn, rows)
    return len(rows)
