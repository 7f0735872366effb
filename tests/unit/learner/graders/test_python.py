"""learner.graders.python: a user's callable as a grader."""

from __future__ import annotations

import pytest

from learner.graders.python import PythonGrader, load_callable
from store.export import to_export
from store.tasks import TaskTable
from tests.support import sample_rewards
from tests.support.trajectories import answered

MODULE = "tests.support.sample_rewards"


def _grade_one(function: str) -> tuple[float | None, str | None]:
    (grade,) = PythonGrader(f"{MODULE}:{function}").grade([answered("abcd")], tasks=TaskTable())
    return grade.reward, grade.error


def test_number_and_bool_results() -> None:
    assert _grade_one("answer_length") == (4.0, None)
    assert _grade_one("is_finished") == (1.0, None)
    assert _grade_one("Scorer.constant") == (0.25, None)


def test_name_and_callable_loaded_once() -> None:
    grader = PythonGrader(f"{MODULE}:answer_length")
    assert grader.name == f"python:{MODULE}:answer_length"
    assert grader.function is sample_rewards.answer_length


def test_the_callable_gets_a_copy() -> None:
    trajectory = answered("abcd")
    (grade,) = PythonGrader(f"{MODULE}:vandal").grade([trajectory], tasks=TaskTable())
    assert grade.reward == 1.0 and len(trajectory.calls) == 1
    assert trajectory.calls[0].request


def test_the_callable_gets_the_export_format() -> None:
    trajectory = answered("abcd")
    sample_rewards.RECEIVED.clear()
    PythonGrader(f"{MODULE}:keeps").grade([trajectory], tasks=TaskTable())
    assert sample_rewards.RECEIVED == [to_export(trajectory)]
    assert sample_rewards.RECEIVED[0]["started_at"] == "2026-01-01T00:00:00+00:00"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("explodes", "RuntimeError: reward function broke"),
        ("not_a_number", "expected a number, got str: 'high'"),
        ("not_finite", "expected a finite number, got nan"),
        ("quits", "SystemExit: 2"),
    ],
)
def test_failures_become_error_grades(function: str, message: str) -> None:
    reward, error = _grade_one(function)
    assert reward is None and error is not None
    assert error.startswith(f"python:{MODULE}:{function} failed: ") and message in error


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_colon", "expected MODULE:FUNCTION"),
        (":f", "expected MODULE:FUNCTION"),
        ("no.such.module_xyz:f", "cannot import 'no.such.module_xyz'"),
        (f"{MODULE}:missing", "has no 'missing'"),
        (f"{MODULE}:NOT_CALLABLE", "'NOT_CALLABLE' is not callable"),
    ],
)
def test_bad_targets_fail_at_build_time(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_callable(target)


@pytest.mark.parametrize(
    ("function", "transient"),
    [("unreachable", True), ("not_now", True), ("explodes", False), ("not_a_number", False)],
)
def test_network_failures_are_transient_the_rest_permanent(function: str, transient: bool) -> None:
    grader = PythonGrader(f"{MODULE}:{function}")
    (grade,) = grader.grade([answered("x")], tasks=TaskTable())
    assert grade.error is not None and grade.transient is transient
