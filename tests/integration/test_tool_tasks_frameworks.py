"""`onthejob rollout` drives the tool tasks through the proxy with third-party agent
frameworks, unchanged (pydantic-ai, the OpenAI Agents SDK), on PostgreSQL and SQLite.

The model is the scripted stand-in teacher behind a fake upstream (no vLLM). On one task it
first makes a malformed call (arguments that are not JSON), on another a well-formed call
the tool cannot answer (an entry the database lacks); the framework answers each with an
error result and goes on. Every run must score 1 through the rows' own grader; each
recorded trajectory is the tool-call turns, then the answer; and the next-turn signals and
per-turn credit, as the learner computes them from the store, judge exactly the flawed
turn."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from learner.graders.next_turn import NextTurnGrader
from learner.proxy_process import ProxyServer
from learner.rollout import RolloutConfig, load_task_set, run_rollout
from learner.rollout.tool_tasks.tasks import ToolTask, make_task_sets, write_jsonl
from learner.rollout.tool_tasks.teacher import ScriptedTeacher
from learner.turn_credit import turn_advantages, turn_values
from store import db
from store.conversation import conversation
from store.rollouts import runs_of
from store.tasks import TaskTable
from store.trajectory_loading import load_trajectories
from store.trajectory_record import Trajectory
from tests.support.fake_vllm import Replier, Whole, completion

TASKS, _ = make_task_sets(0, 6, 0)  # one of each kind
MALFORMED_TASK = TASKS[4]  # lookup, then convert
FAILING_TASK = TASKS[2]  # lookup
TEACHER = ScriptedTeacher(TASKS)
HARNESSES = ("pydantic_ai_agent", "openai_agents_agent")


def _bad_call(task: ToolTask) -> dict[str, Any]:
    """The flawed first call of a flawed task: arguments cut short (not JSON), or a town or
    product the database lacks."""
    arguments = dict(task.gold[0]["arguments"])
    if task == MALFORMED_TASK:
        text = json.dumps(arguments)[:-1]
    else:
        text = json.dumps({**arguments, "name": f"{arguments['name']}x"})
    call = {"id": "bad_0", "type": "function", "function": {"name": "lookup", "arguments": text}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _reply(body: dict[str, Any]) -> Whole:
    messages = body["messages"]
    if TEACHER.task_of(messages) in (MALFORMED_TASK, FAILING_TASK):
        if len(messages) == 1:
            return Whole(_completion(_bad_call(TEACHER.task_of(messages))))
        messages = messages[:1] + messages[3:]  # the teacher goes on as if it had not happened
    return Whole(_completion(dict(TEACHER.reply(messages))))


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return completion(
        message, token_ids=None, logprobs=None, prompt_ids=None, counts=(1, 1), finish=finish
    )


@pytest.fixture
def fake_reply() -> Replier:
    return _reply


def _rollout(harness: str, proxy: ProxyServer, db_url: str, tmp_path: Path) -> dict[str, Any]:
    tasks = load_task_set(write_jsonl(TASKS, tmp_path / "tools-train.jsonl"))
    config = RolloutConfig(
        proxy_url=proxy.url,
        command=[sys.executable, "-m", f"learner.rollout.tool_tasks.{harness}", "{prompt}"],
        tasks=tasks,
        database_url=db_url,
        group_size=1,
        concurrency=2,
        timeout=120,
        settle=0.2,
        record_wait=10,
    )
    summary = run_rollout(config)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            return {r["task_key"]: r for r in runs_of(conn, rollout_id=summary.rollout_id)}
    finally:
        engine.dispose()


def _trajectory(db_url: str, ids: list[str] | None) -> Trajectory:
    engine = db.make_engine(db_url)
    try:
        (trajectory,) = load_trajectories(engine, ids=ids)
    finally:
        engine.dispose()
    return trajectory


def _counts(stderr: str, harness: str) -> dict[str, Any]:
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"{harness}: {{")]
    return json.loads(line.removeprefix(f"{harness}: "))


def _bad_result_is_answered(harness: str, task: ToolTask, result: str) -> None:
    """What the framework answered the flawed call with: the tool's own error, except for
    arguments pydantic-ai cannot parse, which it answers itself before any tool runs."""
    if task == FAILING_TASK:
        assert result.startswith("Error: no entry named"), result
    elif harness == "openai_agents_agent":
        assert result.startswith("Error: the arguments of lookup are not valid JSON"), result
    else:
        (error,) = json.loads(result)["error"]
        assert error["type"] == "json_invalid", result


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_framework_solves_the_tool_tasks_through_the_proxy(
    harness: str, db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    runs = _rollout(harness, proxy, db_url, tmp_path)
    assert sorted(runs) == sorted(t.id for t in TASKS)
    trajectories: dict[str, Trajectory] = {}
    for task in TASKS:
        run = runs[task.id]
        assert (run["status"], run["reward"], run["stdout"].strip()) == ("ok", 1.0, task.answer)
        flawed = task in (MALFORMED_TASK, FAILING_TASK)
        # pydantic-ai turns down arguments that are not JSON itself: no tool of ours ran
        reached = flawed and not (task == MALFORMED_TASK and harness == "pydantic_ai_agent")
        counts = _counts(run["stderr"], harness)
        assert counts == {
            "turns": len(task.gold) + 1 + flawed,
            "tool_calls": len(task.gold) + reached,
            "malformed": int(reached and task == MALFORMED_TASK),
            "failed": int(task == FAILING_TASK),
            "answered": True,
        }, run["stderr"]

        # the trajectory: one call a turn, each but the last calling a tool, the last the
        # answer; the results went back in order (the flawed call's first)
        trajectory = trajectories[task.id] = _trajectory(db_url, run["trajectory_ids"])
        calls = trajectory.calls
        assert len(calls) == counts["turns"]
        replies = [c.response["choices"][0]["message"] for c in calls if c.response]
        assert len(replies) == len(calls)
        assert all(r.get("tool_calls") for r in replies[:-1])
        assert (replies[-1].get("tool_calls"), replies[-1]["content"]) == (None, task.answer)
        last = calls[-1].request
        assert last is not None
        results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
        assert results[flawed:] == [call["result"] for call in task.gold]
        if flawed:
            _bad_result_is_answered(harness, task, results[0])
        # one conversation: each request repeats the last, however it spelt the calls back
        assert "context" not in [m["role"] for m in conversation(calls)]

    # next-turn signals as the learner reads them off the recorded trajectories: the flawed
    # call's turn, and only it, is a failed tool call; per-turn credit trains it down
    grades = NextTurnGrader().grade(list(trajectories.values()), tasks=TaskTable())
    values = {t: turn_values(g.detail) for t, g in zip(trajectories, grades, strict=True)}
    for task in TASKS:
        first = trajectories[task.id].calls[0].id
        flawed = task in (MALFORMED_TASK, FAILING_TASK)
        assert values[task.id] == ({first: -1.0} if flawed else {}), grades
    rules = {s["rule"] for g in grades for s in g.detail.get("signals", [])}
    assert rules == {"tool_error"}
    advantages = turn_advantages(
        {t: [c.id for c in x.calls] for t, x in trajectories.items()},
        values,
        {t: x.interaction_type for t, x in trajectories.items()},
        {t: x.group_key for t, x in trajectories.items() if x.group_key},
    )
    for task in (MALFORMED_TASK, FAILING_TASK):
        ((call, advantage),) = advantages[task.id].items()
        assert call == trajectories[task.id].calls[0].id and advantage < 0
