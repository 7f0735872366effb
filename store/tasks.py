"""The task table: reference answers (and prompts) by task key, loaded from JSONL, and its
rows in the store.

One JSON object a line: {"id", "prompt"?, "answer"?, "match"?, "tolerance"?, "grader"?,
"setup"?, "check"?, "metadata"?}. `grader` is a learner grader SPEC for this task; `setup`
and `check` are shell commands the rollout runner runs in a run's fresh working directory
before the harness and after it (the check's exit code or printed number is the reward).
Invariant: a table that loaded is valid; every mistake is reported with its line and field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from sqlalchemy import Connection, delete, func, select

from store.db import insert_for
from store.grader_specs import parse_spec
from store.json_types import JsonObject
from store.models import Task as TaskRow
from store.models import Trajectory

MATCH_KINDS = ("exact", "numeric", "regex", "contains")
_FIELDS = {"id", "prompt", "answer", "match", "tolerance", "grader", "setup", "check", "metadata"}


class TaskColumns(TypedDict):
    """A task as the task table stores it (store.models.Task)."""

    key: str
    prompt: str | None
    answer: str | None
    match: str
    tolerance: float
    metadata: JsonObject | None
    # the rollout's; a reference-only reload leaves them out, and keeps the stored ones
    grader: NotRequired[str | None]
    setup: NotRequired[str | None]
    check: NotRequired[str | None]


class TaskStats(TypedDict):
    trajectories: int
    mean_reward: float | None  # None: none graded


class TaskTableError(ValueError):
    """A task file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Task:
    key: str
    prompt: str | None = None
    answer: str | None = None
    match: str = "exact"  # one of MATCH_KINDS
    tolerance: float = 1e-6  # absolute, for match="numeric"
    metadata: JsonObject = field(default_factory=dict)  # the task file's, as written
    grader: str | None = None  # a grader SPEC (learner.graders.combine), for this task only
    setup: str | None = None  # shell command preparing a run's working directory
    check: str | None = None  # shell command grading it: exit code or printed number

    def row(self) -> TaskColumns:
        """The task table's row (store.models.Task)."""
        return {
            "key": self.key,
            "prompt": self.prompt,
            "answer": self.answer,
            "match": self.match,
            "tolerance": self.tolerance,
            "metadata": self.metadata,
            "grader": self.grader,
            "setup": self.setup,
            "check": self.check,
        }


class TaskTable(Mapping[str, Task]):
    """Read-only mapping task key -> Task."""

    def __init__(self, tasks: Mapping[str, Task] | None = None) -> None:
        self._tasks = dict(tasks or {})

    @classmethod
    def from_jsonl(cls, path: str | Path) -> TaskTable:
        tasks: dict[str, Task] = {}
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                where = f"{path} line {number}"
                task = parse_task(line, where=where)
                if task.key in tasks:
                    raise TaskTableError(f"{where}: field 'id': duplicate task id {task.key!r}")
                tasks[task.key] = task
        return cls(tasks)

    def __getitem__(self, key: str) -> Task:
        return self._tasks[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


def parse_task(line: str, *, where: str) -> Task:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TaskTableError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise TaskTableError(f"{where}: expected a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - _FIELDS)
    if unknown:  # a typo like "anwser" would otherwise silently drop the reference
        raise TaskTableError(f"{where}: field {unknown[0]!r}: unknown (known: {sorted(_FIELDS)})")
    task = Task(
        key=_key(row, where),
        prompt=_optional_text(row, "prompt", where),
        answer=_answer(row, where),
        match=_match(row, where),
        tolerance=_tolerance(row, where),
        metadata=_metadata(row, where),
        grader=_grader(row, where),
        setup=_command(row, "setup", where),
        check=_command(row, "check", where),
    )
    _check_answer_fits_match(task, where)
    return task


def _fail(where: str, name: str, message: str) -> TaskTableError:
    return TaskTableError(f"{where}: field {name!r}: {message}")


def _key(row: JsonObject, where: str) -> str:
    if "id" not in row:
        raise _fail(where, "id", "missing")
    if not isinstance(row["id"], str) or not row["id"]:
        raise _fail(where, "id", "expected a non-empty string")
    return row["id"]


def _optional_text(row: JsonObject, name: str, where: str) -> str | None:
    value = row.get(name)
    if value is not None and not isinstance(value, str):
        raise _fail(where, name, f"expected a string, got {type(value).__name__}")
    return value


def _answer(row: JsonObject, where: str) -> str | None:
    value = row.get("answer")
    # Numbers are accepted as written ("answer": 42) because numeric tasks are common.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _optional_text(row, "answer", where)


def _match(row: JsonObject, where: str) -> str:
    value = row.get("match", "exact")
    if value not in MATCH_KINDS:
        raise _fail(where, "match", f"expected one of {list(MATCH_KINDS)}, got {value!r}")
    return value


def _tolerance(row: JsonObject, where: str) -> float:
    value = row.get("tolerance", 1e-6)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, "tolerance", f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise _fail(where, "tolerance", f"expected a finite number >= 0, got {value!r}")
    return float(value)


def _grader(row: JsonObject, where: str) -> str | None:
    value = _optional_text(row, "grader", where)
    if value is not None:
        try:
            parse_spec(value)
        except ValueError as exc:
            raise _fail(where, "grader", str(exc)) from None
    return value


def _command(row: JsonObject, name: str, where: str) -> str | None:
    value = _optional_text(row, name, where)
    if value is not None and not value.strip():
        raise _fail(where, name, "expected a shell command, got an empty string")
    return value


def _metadata(row: JsonObject, where: str) -> JsonObject:
    value = row.get("metadata", {})
    if not isinstance(value, dict):
        raise _fail(where, "metadata", f"expected an object, got {type(value).__name__}")
    return value


def _check_answer_fits_match(task: Task, where: str) -> None:
    # Checked at load time so a bad reference fails the start, not every grade.
    if task.answer is None:
        return
    if task.match == "numeric":
        try:
            value = float(task.answer)
        except ValueError:
            message = f"match is numeric but {task.answer!r} is not a number"
            raise _fail(where, "answer", message) from None
        if not math.isfinite(value):
            raise _fail(where, "answer", f"expected a finite number, got {task.answer!r}")
    elif task.match == "regex":
        try:
            re.compile(task.answer)
        except re.error as exc:
            raise _fail(where, "answer", f"invalid regular expression: {exc}") from exc


def list_tasks(
    conn: Connection, *, after: str | None = None, limit: int | None = None
) -> list[TaskColumns]:
    """The task table's rows, by key: those after the key `after`, at most `limit`."""
    query = select(TaskRow.__table__).order_by(TaskRow.key).limit(limit)
    if after is not None:
        query = query.where(TaskRow.key > after)
    return [cast(TaskColumns, dict(r._mapping)) for r in conn.execute(query)]


def task_row(conn: Connection, key: str) -> TaskColumns | None:
    row = conn.execute(select(TaskRow.__table__).where(TaskRow.key == key)).first()
    return None if row is None else cast(TaskColumns, dict(row._mapping))


def delete_task(conn: Connection, key: str) -> bool:
    """Whether there was such a task."""
    return conn.execute(delete(TaskRow).where(TaskRow.key == key)).rowcount > 0


def task_stats(conn: Connection, keys: Sequence[str]) -> dict[str, TaskStats]:
    """Per task key: its trajectories and their mean reward (None: none graded)."""
    if not keys:
        return {}
    rows = conn.execute(
        select(Trajectory.task_key, func.count(), func.avg(Trajectory.reward))
        .where(Trajectory.task_key.in_(keys))
        .group_by(Trajectory.task_key)
    )
    return {
        key: {"trajectories": int(n), "mean_reward": None if mean is None else float(mean)}
        for key, n, mean in rows
    }


def task_table(conn: Connection) -> TaskTable:
    """The task table as the graders read it."""
    rows = conn.execute(select(TaskRow.__table__)).mappings()
    return TaskTable(
        {
            row["key"]: Task(
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


def upsert_tasks(conn: Connection, tasks: Sequence[TaskColumns]) -> None:
    for task in tasks:
        values = {
            "key": task["key"],
            "prompt": task.get("prompt"),
            "answer": task.get("answer"),
            "match": task.get("match", "exact"),
            "tolerance": task.get("tolerance", 1e-6),
            "metadata": task.get("metadata"),
        }
        # rollout columns only when given: a reference-only reload keeps them
        values |= {k: task[k] for k in ("grader", "setup", "check") if k in task}
        stmt = insert_for(conn, TaskRow.__table__).values(values)
        update_values = {k: v for k, v in values.items() if k != "key"}
        conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_=update_values))
