"""The tool tasks' third-party harnesses (pydantic-ai, the OpenAI Agents SDK) as commands:
the framework's own loop with our tools solves a task with the stand-in teacher as its model
behind a fake chat-completions server, sends what the run's environment says, stops out of
turns without an answer, and exits 1 when it cannot reach the model. The tools' results
reach the model verbatim, errors included (frameworks.Counts)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from learner.rollout.tool_tasks import openai_agents_agent, pydantic_ai_agent
from learner.rollout.tool_tasks.frameworks import Counts, tool_specs
from learner.rollout.tool_tasks.tasks import make_task_sets
from learner.rollout.tool_tasks.teacher import ScriptedTeacher
from learner.rollout.tool_tasks.tools import TOOLS, run_tool
from tests.support.fake_vllm import FakeVLLM, Whole, completion

TRAIN, _ = make_task_sets(0, 6, 0)
TEACHER = ScriptedTeacher(TRAIN)
DENSITY = TRAIN[5]  # lookup, lookup, calculator
MAINS: dict[str, Callable[[list[str] | None], int]] = {
    "pydantic_ai_agent": pydantic_ai_agent.main,
    "openai_agents_agent": openai_agents_agent.main,
}


def _teacher(body: dict[str, Any]) -> Whole:
    message = dict(TEACHER.reply(body["messages"]))
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return Whole(
        completion(
            message, token_ids=None, logprobs=None, prompt_ids=None, counts=(1, 1), finish=finish
        )
    )


@pytest.fixture
def teacher() -> Iterator[FakeVLLM]:
    with FakeVLLM(_teacher) as upstream:
        yield upstream


def _run(harness: str, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = MAINS[harness](argv)
    return code, out.getvalue(), err.getvalue()


def _summary(harness: str, err: str) -> dict[str, Any]:
    (line,) = [x for x in err.splitlines() if x.startswith(f"{harness}: {{")]
    return json.loads(line.removeprefix(f"{harness}: "))


def test_the_tools_are_the_family_s_and_answer_verbatim() -> None:
    assert [(s.name, s.description, s.parameters) for s in tool_specs()] == [
        (t["function"]["name"], t["function"]["description"], t["function"]["parameters"])  # type: ignore[index]
        for t in TOOLS
    ]
    counts = Counts()
    cut = '{"name": "Varnholt"'
    assert counts.run("lookup", cut) == run_tool("lookup", cut).content
    assert counts.run("lookup", cut).startswith("Error: the arguments of lookup are not valid")
    missing = counts.run("lookup", {"name": "Nowhere", "field": "population"})
    assert missing.startswith("Error: no entry named 'Nowhere'")
    assert counts.run("calculator", {"expression": "6 * 7"}) == "42"
    assert (counts.tool_calls, counts.malformed, counts.failed) == (4, 2, 1)


@pytest.mark.parametrize("harness", MAINS)
def test_the_command_solves_a_task_with_the_run_s_environment(
    harness: str, teacher: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{teacher.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("ONTHEJOB_TASK", DENSITY.id)
    argv = [DENSITY.prompt, "--model", "m", "--max-tokens", "64", "--temperature", "0.5"]
    code, out, err = _run(harness, argv)
    assert (code, out) == (0, DENSITY.answer + "\n"), err
    assert _summary(harness, err) == {
        "turns": 4,
        "tool_calls": 3,
        "malformed": 0,
        "failed": 0,
        "answered": True,
    }
    assert len(teacher.requests) == 4
    body, headers = teacher.requests[-1], teacher.headers[-1]
    assert (headers["authorization"], headers["x-onthejob-task"]) == ("Bearer k", DENSITY.id)
    assert (body["model"], body["temperature"]) == ("m", 0.5)
    assert 64 in (body.get("max_tokens"), body.get("max_completion_tokens"))
    # our definitions, as the framework spells them (pydantic-ai makes them strict)
    sent = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
    assert {s.name: s.parameters["properties"] for s in tool_specs()} == {
        name: parameters["properties"] for name, parameters in sent.items()
    }
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    assert results == [call["result"] for call in DENSITY.gold]


@pytest.mark.parametrize("harness", MAINS)
def test_out_of_turns_it_has_no_answer_and_exits_0(
    harness: str, teacher: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{teacher.url}/v1")
    code, out, err = _run(harness, [DENSITY.prompt, "--max-turns", "2"])
    assert (code, out) == (0, "\n"), err
    summary = _summary(harness, err)
    assert (summary["answered"], summary["turns"]) == (False, 2)
    assert len(teacher.requests) == 2


@pytest.mark.parametrize("harness", MAINS)
def test_a_model_it_cannot_reach_exits_1(harness: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    code, out, err = _run(harness, ["What is 1?"])
    assert (code, out) == (1, "") and f"{harness}: the model failed:" in err


@pytest.mark.parametrize("harness", MAINS)
def test_without_a_base_url_it_is_a_usage_error(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        _run(harness, ["What is 1?"])
    assert exited.value.code == 2


def _calls_search(body: dict[str, Any]) -> Whole:
    """A model that calls a tool nobody offered, then answers once it has a result."""
    answered = any(m["role"] == "tool" for m in body["messages"])
    call = {"id": "s1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    message = {"role": "assistant", "content": "4"} if answered else {
        "role": "assistant", "content": None, "tool_calls": [call]}  # fmt: skip
    return Whole(completion(message, token_ids=None, logprobs=None, prompt_ids=None, counts=(1, 1)))


@pytest.mark.parametrize("harness", MAINS)
def test_a_tool_that_does_not_exist_is_the_framework_s_to_answer(
    harness: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeVLLM(_calls_search) as upstream:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{upstream.url}/v1")
        code, out, err = _run(harness, ["What is 2 + 2?"])
    summary = _summary(harness, err)
    assert (code, summary["tool_calls"]) == (0, 0), err
    if harness == "pydantic_ai_agent":  # an error result (a failed call's signal), and on
        (result,) = [m["content"] for m in upstream.requests[-1]["messages"] if m["role"] == "tool"]
        assert json.loads(result)["error"].startswith("Unknown tool name: 'search'")
        assert (out, summary["turns"]) == ("4\n", 2)
    else:  # the SDK ends the run: no answer
        assert (out, summary["turns"]) == ("\n", 1)
        assert "gave up: Tool search not found" in err
