"""learner.graders.combine: grader specs and their weighted combination."""

from __future__ import annotations

from typing import Any

import pytest

from learner.graders.base import Grade
from learner.graders.combine import CombinedGrader, build_graders, parse_spec
from learner.graders.feedback import Posted
from store.tasks import Task, TaskTable
from store.trajectory_record import Trajectory
from tests.support.trajectories import answered

MODULE = "tests.support.sample_rewards"
TASKS = TaskTable({"mul": Task("mul", "6*7?", "42", match="numeric")})


# -- parse_spec ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("reference", ("reference", None, 1.0)),
        ("reference@0.5", ("reference", None, 0.5)),
        (" feedback@2 ", ("feedback", None, 2.0)),
        ("python:pkg.mod:fn", ("python", "pkg.mod:fn", 1.0)),
        ("python:pkg.mod:Cls.fn@3", ("python", "pkg.mod:Cls.fn", 3.0)),
        ("command:pytest -q tests/", ("command", "pytest -q tests/", 1.0)),
        ("command:grep -c 'a:b' x@y.txt", ("command", "grep -c 'a:b' x@y.txt", 1.0)),
        ("command:echo a@b:c@.25", ("command", "echo a@b:c", 0.25)),
        ("command:echo 1@1e-1", ("command", "echo 1", 0.1)),
        ("judge", ("judge", None, 1.0)),
        ("judge@0.3", ("judge", None, 0.3)),
        ("judge:http://127.0.0.1:8000/v1", ("judge", "http://127.0.0.1:8000/v1", 1.0)),
        ("judge:https://u:p@host/v1@2.5", ("judge", "https://u:p@host/v1", 2.5)),
    ],
)
def test_parse_spec(spec: str, parsed: tuple[str, str | None, float]) -> None:
    assert parse_spec(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "unknown kind ''"),
        ("rubric", "unknown kind 'rubric'; expected reference, next_turn[:judge], python:MODULE"),
        ("next_turn:x", "expected next_turn or next_turn:judge"),
        ("reference@heavy", "unknown kind 'reference@heavy' (a weight is @ followed by a number)"),
        ("reference@0", "the weight must be a positive number"),
        ("reference@-1", "the weight must be a positive number"),
        ("reference:x", "reference takes no argument"),
        ("feedback:x", "feedback takes no argument"),
        ("python:module_only", "expected python:MODULE:FUNCTION"),
        ("python:mod:", "expected python:MODULE:FUNCTION"),
        ("python:mod:fn(x)", "expected python:MODULE:FUNCTION"),
        ("command:", "expected command:SHELL_COMMAND"),
        ("command:   @2", "expected command:SHELL_COMMAND"),
        ("judge:localhost:8000", "expected judge or judge:http(s)://HOST[:PORT]/v1"),
        ("judge:", "expected judge or judge:http(s)://HOST[:PORT]/v1"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_spec(spec)
    assert message in str(caught.value) and repr(spec) in str(caught.value)


# -- build_graders ---------------------------------------------------------------------------


class NoFeedback:
    def reward_for(self, trajectory_id: str, session: str | None) -> Posted | None:
        return None


def test_builds_every_kind_cheap_ones_first() -> None:
    combined = build_graders(
        [
            "judge:http://127.0.0.1:9/v1@0.5",
            "command:echo 1",
            f"python:{MODULE}:is_finished@2",
            "reference",
            "feedback",
        ],
        feedback_source=NoFeedback(),
        command_timeout=5,
    )
    try:
        names = [(grader.name, weight) for grader, weight in combined.components]
        assert names == [
            ("feedback", 1.0),
            ("reference", 1.0),
            (f"python:{MODULE}:is_finished", 2.0),
            ("command:echo 1", 1.0),
            ("judge:http://127.0.0.1:9/v1", 0.5),
        ]
        assert getattr(combined.components[3][0], "timeout", None) == 5
    finally:
        combined.close()


@pytest.mark.parametrize(
    ("specs", "kwargs", "message"),
    [
        ([], {}, "no grader given"),
        (["judge"], {}, "no judge base URL"),
        (["feedback"], {}, "no feedback source is configured"),
        (["reference", "reference@2"], {}, "'reference' is given twice"),
        ([f"python:{MODULE}:nope"], {}, "has no 'nope'"),
    ],
)
def test_build_errors(specs: list[str], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_graders(specs, **kwargs)


def test_judge_uses_the_default_base_url_and_model() -> None:
    combined = build_graders(["judge"], judge_base_url="http://vllm:8000/v1", judge_model="m")
    judge: Any = combined.components[0][0]
    try:
        assert judge.name == "judge" and judge.model == "m"
        assert str(judge.client.base_url) == "http://vllm:8000/v1/"
    finally:
        combined.close()


# -- CombinedGrader --------------------------------------------------------------------------


class Fixed:
    """A grader that hands out prepared grades and records what it was asked to grade."""

    def __init__(self, name: str, *grades: Grade) -> None:
        self.name = name
        self.grades = list(grades)
        self.seen: list[list[str]] = []

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        self.seen.append([t.id for t in trajectories])
        return [self.grades.pop(0) for _ in trajectories]


class Raises:
    name = "raises"

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        raise RuntimeError("bug in grader")


def test_weighted_mean_normalised_over_the_weights() -> None:
    first = Fixed("first", Grade(1.0, {"a": 1}), Grade(0.0, {}))
    second = Fixed("second", Grade(0.5, {}), Grade(0.2, {"b": 2}))
    combined = CombinedGrader([(first, 3.0), (second, 1.0)])
    one, two = combined.grade([answered("x"), answered("y")], tasks=TASKS)
    assert one.reward == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert two.reward == pytest.approx(0.2 / 4)
    assert one.error is None and not one.pending
    assert one.detail == {
        "first": {"reward": 1.0, "weight": 3.0, "detail": {"a": 1}},
        "second": {"reward": 0.5, "weight": 1.0, "detail": {}},
    }
    assert combined.name == "first@3 + second@1"


def test_errors_win_then_pending_and_decided_ones_skip_later_graders() -> None:
    waits = Fixed("feedback", Grade.waiting(), Grade(1.0, {}), Grade(1.0, {}))
    fails = Fixed("command", Grade.failed("exited with status 3"), Grade(0.5, {}))
    last = Fixed("judge", Grade(0.0, {}))
    batch = [answered("pending"), answered("error"), answered("ok")]
    pending, error, ok = CombinedGrader([(waits, 1), (fails, 1), (last, 2)]).grade(
        batch, tasks=TASKS
    )
    assert pending.pending and pending.reward is None and pending.error is None
    waited = {"reward": None, "weight": 1, "detail": {}, "pending": True}
    assert pending.detail == {"feedback": waited}
    assert error.error == "command: exited with status 3" and error.reward is None
    assert ok.reward == pytest.approx((1.0 + 0.5 + 0.0) / 4)
    assert fails.seen == [[batch[1].id, batch[2].id]]
    assert last.seen == [[batch[2].id]]


def test_every_component_error_is_reported() -> None:
    a, b = Fixed("a", Grade.failed("x")), Fixed("b", Grade.failed("y"))
    (grade,) = CombinedGrader([(a, 1), (b, 1)]).grade([answered("z")], tasks=TASKS)
    assert grade.error == "a: x"  # b never saw it: the trajectory was already skipped
    assert b.seen == []


def test_a_grader_that_raises_or_miscounts_fails_only_this_batch() -> None:
    (grade,) = CombinedGrader([(Raises(), 1)]).grade([answered("x")], tasks=TASKS)
    assert grade.error == "raises: RuntimeError: bug in grader"
    short = Fixed("short")
    short.grade = lambda trajectories, *, tasks: []  # type: ignore[method-assign]
    (grade,) = CombinedGrader([(short, 1)]).grade([answered("x")], tasks=TASKS)
    assert grade.error == "short: returned 0 grades for 1"


def test_a_grade_without_reward_or_error_is_an_error() -> None:
    (grade,) = CombinedGrader([(Fixed("odd", Grade(None, {})), 1)]).grade(
        [answered("x")], tasks=TASKS
    )
    assert grade.error == "odd: gave neither a reward nor an error"


def test_no_components_is_refused() -> None:
    with pytest.raises(ValueError, match="positive weights"):
        CombinedGrader([])


def test_real_graders_end_to_end() -> None:
    combined = build_graders(["reference@3", f"python:{MODULE}:answer_length", "command:echo 0"])
    right, wrong = combined.grade([answered("42"), answered("7")], tasks=TASKS)
    assert right.reward == pytest.approx((3 * 1.0 + 2.0 + 0.0) / 5)
    assert wrong.reward == pytest.approx((0.0 + 1.0 + 0.0) / 5)
    assert set(right.detail) == {"reference", f"python:{MODULE}:answer_length", "command:echo 0"}
    assert right.detail["reference"]["detail"]["found"] == "42.0"


def test_a_combined_failure_is_transient_only_if_every_component_failure_is() -> None:
    later = Fixed("judge", Grade.retry("timed out"), Grade.retry("timed out"))
    never = Fixed("command", Grade.failed("exited with status 1"))
    both = CombinedGrader([(later, 1)]).grade([answered("a"), answered("b")], tasks=TASKS)
    assert all(g.transient and g.error == "judge: timed out" for g in both)
    (mixed,) = CombinedGrader([(Fixed("ref", Grade(1.0, {})), 1), (never, 1)]).grade(
        [answered("c")], tasks=TASKS
    )
    assert mixed.error and not mixed.transient

    # a grader that raises a network error fails transiently
    def slow(trajectories: Any, *, tasks: Any) -> list[Grade]:
        raise TimeoutError("slow")

    down = Fixed("down")
    down.grade = slow  # type: ignore[method-assign]
    (grade,) = CombinedGrader([(down, 1)]).grade([answered("d")], tasks=TASKS)
    assert grade.transient and "TimeoutError: slow" in (grade.error or "")
