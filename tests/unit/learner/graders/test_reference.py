"""learner.graders.reference: the final answer against the task's reference answer."""

from __future__ import annotations

from typing import Any

import pytest

from learner.graders.reference import ReferenceGrader, last_number, match
from store.tasks import Task, TaskTable
from store.trajectory_record import Trajectory
from tests.support.trajectories import (
    chat_call,
    failed_call,
    messages_call,
    responses_call,
    trajectory,
)

TASKS = TaskTable(
    {
        "mul": Task("mul", "What is 6 times 7?", "42", match="numeric"),
        "exact": Task("exact", None, "Paris"),
        "regex": Task("regex", None, r"\bcolou?r\b", match="regex"),
        "contains": Task("contains", None, "Hello World", match="contains"),
        "open": Task("open", "Write a poem.", None),
    }
)


def _grade(*trajectories: Trajectory) -> list[Any]:
    return ReferenceGrader().grade(list(trajectories), tasks=TASKS)


@pytest.mark.parametrize("make_call", [chat_call, responses_call, messages_call])
def test_numeric_answer_in_every_response_shape(make_call: Any) -> None:
    right, wrong = _grade(
        trajectory(make_call("6*7: I think 41, no: 42.")),
        trajectory(make_call("42 is wrong, it is 43")),
    )
    assert right.reward == 1.0 and right.error is None
    assert right.detail["found"] == "42.0" and right.detail["match"] == "numeric"
    assert wrong.reward == 0.0 and wrong.detail["found"] == "43.0"


@pytest.mark.parametrize(
    ("kind", "answer", "text", "expected"),
    [
        ("exact", "Paris", "  Paris\n", True),
        ("exact", "Paris", "paris", False),
        ("exact", "Paris", "Paris, France", False),
        ("regex", r"\bcolou?r\b", "the color red", True),
        ("regex", r"^\d+$", "12a", False),
        ("contains", "Hello World", "well, HELLO world!", True),
        ("contains", "Hello World", "hello", False),
        ("numeric", "42", "no number here", False),
        ("numeric", "1234.5", "total: 1,234.5", True),
        ("numeric", "-3", "x = -3", True),
        ("numeric", "0.5", "half is .5", True),
        ("numeric", "1e-3", "1.0E-3", True),
    ],
)
def test_match_kinds(kind: str, answer: str, text: str, expected: bool) -> None:
    assert match(text, answer=answer, kind=kind, tol=1e-6)[0] is expected


def test_numeric_tolerance_is_absolute() -> None:
    assert match("3.14", answer="3.14159", kind="numeric", tol=0.01)[0]
    assert not match("3.14", answer="3.14159", kind="numeric", tol=0.001)[0]


def test_last_number_wins() -> None:
    assert last_number("step 1: 10, step 2: 20, answer 30.") == 30.0
    assert last_number("none") is None


def test_regex_detail_records_the_matched_span() -> None:
    (grade,) = _grade(trajectory(chat_call("my colour is blue"), task_key="regex"))
    assert grade.reward == 1.0 and grade.detail["found"] == "colour"


def test_no_task_or_no_answer_is_an_error() -> None:
    unknown, no_answer, no_key = _grade(
        trajectory(chat_call("42"), task_key="unknown"),
        trajectory(chat_call("a poem"), task_key="open"),
        trajectory(chat_call("42"), task_key=None),
    )
    assert unknown.reward is None and unknown.error == "no reference answer for task 'unknown'"
    assert no_answer.error == "no reference answer for task 'open'"
    assert no_key.error == "no reference answer for task None"
    # the task table may gain the task (tasks load, the admin API): graded again then
    assert unknown.transient and no_answer.transient and no_key.transient


def test_no_final_answer_is_an_error() -> None:
    (grade,) = _grade(trajectory(failed_call()))
    assert grade.reward is None and grade.error is not None and "no final answer" in grade.error


def test_detail_keeps_only_the_tail_of_a_long_answer() -> None:
    (grade,) = _grade(trajectory(chat_call("x" * 5000 + " 42")))
    assert grade.reward == 1.0 and len(grade.detail["answer_tail"]) == 500
