"""store.tasks: loading and validating the task table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from store.tasks import Task, TaskTable, TaskTableError


def _write(tmp_path: Path, *rows: Any) -> Path:
    path = tmp_path / "tasks.jsonl"
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loads_every_field_with_defaults(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"id": "a", "prompt": "2+2?", "answer": "4"},
        "",
        {"id": "b", "answer": 3.5, "match": "numeric", "tolerance": 0.1, "metadata": {"k": 1}},
        {"id": "c"},
    )
    table = TaskTable.from_jsonl(path)
    assert len(table) == 3 and list(table) == ["a", "b", "c"]
    assert table.get("a") == Task(key="a", prompt="2+2?", answer="4")
    assert table["b"] == Task("b", None, "3.5", "numeric", 0.1, {"k": 1})
    assert table["c"].answer is None and table["c"].match == "exact"
    assert table["c"].tolerance == 1e-6
    assert table.get("missing") is None and "a" in table


def test_empty_table() -> None:
    assert len(TaskTable()) == 0 and TaskTable().get("x") is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
        ({"prompt": "p"}, "line 2: field 'id': missing"),
        ({"id": ""}, "line 2: field 'id': expected a non-empty string"),
        ({"id": 7}, "line 2: field 'id': expected a non-empty string"),
        ({"id": "x", "anwser": "4"}, "line 2: field 'anwser': unknown"),
        ({"id": "x", "prompt": ["p"]}, "line 2: field 'prompt': expected a string, got list"),
        ({"id": "x", "answer": True}, "line 2: field 'answer': expected a string, got bool"),
        ({"id": "x", "match": "fuzzy"}, "line 2: field 'match': expected one of"),
        ({"id": "x", "tolerance": "0.1"}, "line 2: field 'tolerance': expected a number"),
        ({"id": "x", "tolerance": -1}, "line 2: field 'tolerance': expected a finite number >= 0"),
        ({"id": "x", "metadata": []}, "line 2: field 'metadata': expected an object, got list"),
        ({"id": "x", "answer": "four", "match": "numeric"}, "field 'answer': match is numeric"),
        ({"id": "x", "answer": "nan", "match": "numeric"}, "field 'answer': expected a finite"),
        ({"id": "x", "answer": "(", "match": "regex"}, "field 'answer': invalid regular exp"),
        ({"id": "first"}, "line 2: field 'id': duplicate task id 'first'"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_errors_name_line_and_field(tmp_path: Path, row: Any, message: str) -> None:
    path = _write(tmp_path, {"id": "first", "answer": "1"}, row)
    with pytest.raises(TaskTableError) as caught:
        TaskTable.from_jsonl(path)
    assert message in str(caught.value)
    assert str(caught.value).startswith(str(path))


def test_task_table_error_is_a_value_error() -> None:
    assert issubclass(TaskTableError, ValueError)
