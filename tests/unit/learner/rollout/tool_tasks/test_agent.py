"""learner/rollout/tool_tasks/agent.py: the bundled tool loop solves every task with the
stand-in teacher as its model, answers a malformed call with an error result and counts it,
and as a command talks plain HTTP to a chat-completions server."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

import pytest

from learner.rollout.tool_tasks import agent
from learner.rollout.tool_tasks.agent import Outcome, solve
from learner.rollout.tool_tasks.grading import score
from learner.rollout.tool_tasks.tasks import make_task_sets
from learner.rollout.tool_tasks.teacher import ScriptedTeacher, tool_call_message
from learner.rollout.tool_tasks.tools import TOOLS
from store.json_types import JsonObject, JsonValue
from tests.support.fake_vllm import FakeVLLM, Raw, Whole

TRAIN, HELDOUT = make_task_sets(0, 24, 12)
TEACHER = ScriptedTeacher(TRAIN + HELDOUT)
DENSITY = TRAIN[5]  # lookup, lookup, calculator


def _teacher(messages: list[JsonObject], **fields: JsonValue) -> JsonObject:
    assert fields["tools"] == TOOLS
    return dict(TEACHER.reply(messages))


def test_with_the_teacher_as_its_model_it_solves_every_task() -> None:
    for task in TRAIN + HELDOUT:
        outcome = solve(_teacher, task.prompt)
        assert outcome == Outcome(task.answer, len(task.gold) + 1, len(task.gold), 0, 0)
        assert score(outcome.answer, task.answer).reward == 1.0


def test_a_malformed_call_gets_an_error_result_counted_and_the_loop_goes_on() -> None:
    seen: list[list[JsonObject]] = []
    bad: list[JsonObject] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "b1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"name": "Quellby"'},
                },
                {"id": "b2", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "arguments": '{"name": "Quelby", "field": "population"}',
                    },
                },
                "not a call",
            ],
        },
    ]

    def model(messages: list[JsonObject], **fields: JsonValue) -> JsonObject:
        seen.append(list(messages))
        if len(seen) <= len(bad):
            return bad[len(seen) - 1]
        # then the teacher, as if the conversation had been clean: the question, and what
        # came after the bad turns and their four results
        return dict(TEACHER.reply(messages[:1] + messages[1 + len(bad) + 4 :]))

    outcome = solve(model, DENSITY.prompt, max_turns=8)
    assert (outcome.answer, outcome.turns) == (DENSITY.answer, 6)
    assert (outcome.tool_calls, outcome.malformed, outcome.failed) == (7, 3, 1)
    results = [m["content"] for m in seen[2] if m["role"] == "tool"]
    assert results == [
        "Error: the arguments of lookup are not valid JSON (Expecting ',' delimiter: "
        "line 1 column 19 (char 18))",
        "Error: unknown tool 'search'; the tools are calculator, convert, lookup",
        "Error: no entry named 'Quelby' in the database (did you mean 'Quellby'?)",
        "Error: unknown tool None; the tools are calculator, convert, lookup",
    ]
    # a call without an id still gets its result under an id of its own
    assert [m["tool_call_id"] for m in seen[2] if m["role"] == "tool"] == [
        "b1",
        "b2",
        "call_1_0",
        "call_1_1",
    ]


def test_out_of_turns_it_has_no_answer() -> None:
    call = tool_call_message(DENSITY.gold[0], 0)
    outcome = solve(lambda messages, **fields: dict(call), DENSITY.prompt, max_turns=3)
    assert (outcome.answer, outcome.turns, outcome.tool_calls) == (None, 3, 3)
    assert json.loads(outcome.summary().removeprefix("tool_agent: "))["answered"] is False


def test_a_system_prompt_goes_first() -> None:
    seen: list[JsonObject] = []

    def model(messages: list[JsonObject], **fields: JsonValue) -> JsonObject:
        seen.extend(messages)
        return {"role": "assistant", "content": "1"}

    solve(model, "What is 1?", system="Use the tools.")
    assert seen == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is 1?"},
    ]


def _teacher_answers(body: JsonObject) -> Whole:
    """The stand-in teacher as the model behind a chat-completions server."""
    return Whole({"choices": [{"index": 0, "message": TEACHER.reply(body["messages"])}]})


@pytest.fixture
def server() -> Iterator[FakeVLLM]:
    with FakeVLLM(_teacher_answers) as upstream:
        yield upstream


def _main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = agent.main(argv)
    return code, out.getvalue(), err.getvalue()


def test_the_command_over_http(server: FakeVLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ONTHEJOB_TASK", DENSITY.id)
    code, out, err = _main([DENSITY.prompt, "--model", "m", "--max-tokens", "64"])
    assert (code, out) == (0, DENSITY.answer + "\n")
    summary = json.loads(err.strip().removeprefix("tool_agent: "))
    assert summary == {
        "answer": DENSITY.answer,
        "turns": 4,
        "tool_calls": 3,
        "malformed": 0,
        "failed": 0,
        "answered": True,
    }
    assert len(server.requests) == 4
    body, headers = server.requests[-1], server.headers[-1]
    assert (headers["authorization"], headers["x-onthejob-task"]) == ("Bearer k", DENSITY.id)
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("m", 64, 1.0)
    assert body["tools"] == TOOLS
    # the prompt may come from the environment instead
    monkeypatch.setenv("ONTHEJOB_PROMPT", TRAIN[0].prompt)
    assert _main([])[:2] == (0, TRAIN[0].answer + "\n")


def test_a_model_it_cannot_reach_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    code, out, err = _main(["What is 1?"])
    assert (code, out) == (1, "") and "tool_agent: the model failed:" in err


@pytest.mark.parametrize(
    ("body", "length", "error"),
    [
        (b'{"choices": [', 100, "broke off: IncompleteRead"),  # the reply cut short
        (b"<html>busy</html>", None, "answered something not JSON"),
        (b"[" * 100_000, None, "answered something not JSON: maximum recursion depth"),
        (b'{"choices": [{"message": "hi"}]}', None, 'answered no chat completion: {"choices"'),
        (b'{"choices": [{"message": ["ab"]}]}', None, "answered no chat completion"),
        (b'{"choices": []}', None, "answered no chat completion"),
        (b"null", None, "answered no chat completion: null"),
    ],
)
def test_a_model_that_answers_wrong_exits_1_saying_what_failed(
    body: bytes, length: int | None, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeVLLM(lambda request: Raw(body, length)) as upstream:
        monkeypatch.setenv("OPENAI_BASE_URL", upstream.url + "/v1")
        code, out, err = _main(["What is 1?"])
    assert (code, out) == (1, "")
    assert err.startswith("tool_agent: the model failed: http://127.0.0.1:") and error in err, err
