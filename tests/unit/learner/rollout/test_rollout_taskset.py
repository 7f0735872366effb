"""Task sets: the issue's format, and errors that name the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.rollout.taskset import load_task_set
from store.tasks import TaskTableError


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_field_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"id": "a", "prompt": "p", "answer": 4, "match": "numeric"}',
        "",
        '{"id": "b", "prompt": "q", "grader": "command:wc -c@2", "setup": "git init",'
        ' "check": "pytest -q", "metadata": {"repo": "x"}}',
    )
    task_set = load_task_set(path)
    assert task_set.name == "set" and list(task_set.tasks) == ["a", "b"]
    a, b = task_set.tasks["a"], task_set.tasks["b"]
    assert (a.answer, a.check, a.setup, a.grader) == ("4", None, None, None)
    assert (b.grader, b.setup, b.check, b.metadata) == (
        "command:wc -c@2",
        "git init",
        "pytest -q",
        {"repo": "x"},
    )
    assert b.row()["check"] == "pytest -q" and b.row()["key"] == "b"
    assert load_task_set(path, name="mine").name == "mine"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "b", "check": 3}', "line 2: field 'check': expected a string, got int"),
        ('{"id": "b", "setup": "  "}', "line 2: field 'setup': expected a shell command"),
        ('{"id": "b", "grader": "magic"}', "line 2: field 'grader': grader spec 'magic'"),
        ('{"id": "b", "grader": "python:nomodule"}', "line 2: field 'grader'"),
        ('{"id": "b", "chek": "make"}', "line 2: field 'chek': unknown"),
        ('{"id": "a"}', "line 2: field 'id': duplicate task id 'a'"),
        ('{"prompt": "no id"}', "line 2: field 'id': missing"),
        ('{"id": "b", "metadata": []}', "line 2: field 'metadata': expected an object"),
        ("[1]", "line 2: expected a JSON object"),
        ("{oops", "line 2: not valid JSON"),
    ],
)
def test_errors_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, '{"id": "a", "prompt": "fine"}', line)
    with pytest.raises(TaskTableError) as error:
        load_task_set(path)
    assert f"{path} {message}" in str(error.value)


def test_empty_or_missing_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskTableError, match="no tasks"):
        load_task_set(write(tmp_path, ""))
    with pytest.raises(TaskTableError, match="cannot read"):
        load_task_set(tmp_path / "absent.jsonl")
