"""learner/rollout/tool_tasks/grading.py: right, rounded (half credit) and wrong answers,
and the grader as the learner's `python:` grader and the rollout runner's task grader."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from learner.graders.python import PythonGrader
from learner.rollout.grading import SpecGraders, grade_run
from learner.rollout.tool_tasks.grading import calls_tools, final_text, grade, score
from learner.rollout.tool_tasks.tasks import GRADER, make_task_sets
from store.export import to_export
from store.tasks import TaskTable, parse_task
from store.trajectory_record import TrajectoryCall
from tests.support.trajectories import (
    chat_call,
    completions_call,
    failed_call,
    messages_call,
    responses_call,
    trajectory,
)

# "What is 322 times 72, plus 542?" -> 23726; "Convert 82.7 meters to feet." -> 271.33
(TASK, CONVERT), _ = make_task_sets(0, 2, 0)


@pytest.mark.parametrize(
    ("text", "answer", "reward", "verdict"),
    [
        ("23726", "23726", 1.0, "right"),
        ("The answer is 23,726.", "23726", 1.0, "right"),
        ("322 * 72 + 542 = 23726", "23726", 1.0, "right"),
        ("27.56", "27.56", 1.0, "right"),
        ("27.560 lb", "27.56", 1.0, "right"),
        ("-16.67", "-16.67", 1.0, "right"),
        ("0.79 km", "0.79", 1.0, "right"),
        # right as far as it goes: rounded to fewer decimals than the reference has
        ("About 27.6 pounds.", "27.56", 0.5, "rounded"),
        ("28", "27.56", 0.5, "rounded"),
        ("-17", "-16.67", 0.5, "rounded"),
        # wrong
        ("27", "27.56", 0.0, "wrong"),
        ("27.5", "27.56", 0.0, "wrong"),
        ("27.55", "27.56", 0.0, "wrong"),
        ("23700", "23726", 0.0, "wrong"),  # an integer reference has no rounded answer
        ("23726, or maybe 12", "23726", 0.0, "wrong"),  # the last number counts
        ("I cannot tell.", "23726", 0.0, "no number"),
        ("", "23726", 0.0, "no answer"),
        (None, "23726", 0.0, "no answer"),
    ],
)
def test_score(text: str | None, answer: str, reward: float, verdict: str) -> None:
    assert (score(text, answer).reward, score(text, answer).verdict) == (reward, verdict)


def _graded(*answers: str | None, key: str | None = TASK.id) -> float | None:
    calls = [chat_call(a, question=TASK.prompt) for a in answers]
    (result,) = PythonGrader(GRADER.removeprefix("python:")).grade(
        [trajectory(*calls, task_key=key)], tasks=TaskTable()
    )
    assert result.error is None, result.error
    return result.reward


def test_the_python_grader_finds_the_task_by_its_key() -> None:
    assert _graded(None, "23726") == 1.0  # a tool call, then the answer
    assert _graded(None, "about 23,730") == 0.0
    assert _graded(None) == 0.0  # it ended on a tool call: no answer
    assert _graded("23726", None) == 0.0  # the last answered call decides


def test_a_failed_last_call_leaves_the_answer_before_it() -> None:
    export = to_export(trajectory(chat_call("23726"), failed_call(), task_key=TASK.id))
    assert final_text(export) == "23726" and grade(export) == 1.0


def _with_a_tool_call(call: TrajectoryCall) -> TrajectoryCall:
    """`call` whose reply, its text kept, also calls the calculator, in the call's API shape."""
    response: Any = json.loads(json.dumps(call.response))
    arguments = '{"expression": "322 * 72 + 542"}'
    if call.api == "chat.completions":
        response["choices"][0]["message"]["tool_calls"] = [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "calculator", "arguments": arguments},
            }
        ]
    elif call.api == "responses":
        response["output"].append(
            {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": arguments}
        )
    return dataclasses.replace(call, response=response)


@pytest.mark.parametrize(
    "call",
    [
        _with_a_tool_call(chat_call("The answer is 23726")),
        _with_a_tool_call(responses_call("The answer is 23726")),
        messages_call("The answer is 23726"),  # a tool_use block between its two texts
    ],
    ids=["chat", "responses", "messages"],
)
def test_a_run_that_ends_on_a_tool_call_scores_0_whatever_text_is_beside_it(
    call: TrajectoryCall,
) -> None:
    export = to_export(trajectory(chat_call(None), call, task_key=TASK.id))
    assert call.response is not None and calls_tools(call.response)
    assert final_text(export) == "" and grade(export) == 0.0


@pytest.mark.parametrize(
    "call",
    [chat_call("The answer is 23726"), responses_call("23726"), completions_call("23726")],
    ids=["chat", "responses", "completions"],
)
def test_a_reply_without_a_tool_call_is_the_final_answer(call: TrajectoryCall) -> None:
    export = to_export(trajectory(chat_call(None), call, task_key=TASK.id))
    assert call.response is not None and not calls_tools(call.response)
    assert grade(export) == 1.0


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (None, "the trajectory has no task key"),
        ("mul", "'mul' is not a tools task id"),
    ],
)
def test_a_trajectory_of_no_tool_task_is_an_error_not_a_zero(key: str | None, error: str) -> None:
    (result,) = PythonGrader(GRADER.removeprefix("python:")).grade(
        [trajectory(chat_call("1"), task_key=key)], tasks=TaskTable()
    )
    assert result.reward is None and result.error is not None and error in result.error


def test_the_rollout_runner_grades_a_run_with_the_rows_grader() -> None:
    task = parse_task(json.dumps(CONVERT.row()), where="row")
    assert task.answer == "271.33"
    specs = SpecGraders()
    try:
        # half credit: the row's grader, not its reference answer (which would give 0)
        for answer, reward in (("271.33", 1.0), ("271.3", 0.5), ("271.4", 0.0)):
            result = grade_run(
                task,
                tasks=TaskTable({task.key: task}),
                default_grader=None,
                specs=specs,
                trajectories=[trajectory(chat_call(answer), task_key=task.key)],
                stdout=answer,
                check=lambda: pytest.fail("no check command"),
            )
            assert (result.reward, result.error) == (reward, None)
    finally:
        specs.close()
