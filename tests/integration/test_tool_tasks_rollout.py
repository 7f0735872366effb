"""`onthejob rollout`'s runner drives the tool tasks' bundled agent through the proxy, on
PostgreSQL and SQLite. The model is the scripted stand-in teacher behind a fake upstream
(no vLLM), so every run must score 1 through the rows' own grader (the family's `python:`
grader); on one task it first makes a malformed call, which the agent answers with an error
result and counts, and the run still scores 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from learner.proxy_process import ProxyServer
from learner.rollout import RolloutConfig, load_task_set, run_rollout
from learner.rollout.tool_tasks.agent import SUMMARY_PREFIX
from learner.rollout.tool_tasks.tasks import make_task_sets, write_jsonl
from learner.rollout.tool_tasks.teacher import ScriptedTeacher
from store import db
from store.rollouts import runs_of
from tests.support.fake_vllm import Replier, Whole, completion

TASKS, _ = make_task_sets(0, 6, 0)  # one of each kind
FLAWED = TASKS[4]  # lookup, then convert
BAD_CALL = {
    "id": "bad_0",
    "type": "function",
    "function": {
        "name": "lookup",
        "arguments": json.dumps(FLAWED.gold[0]["arguments"])[:-1],  # cut short: not JSON
    },
}
TEACHER = ScriptedTeacher(TASKS)


def _reply(body: dict[str, Any]) -> Whole:
    messages = body["messages"]
    if TEACHER.task_of(messages) == FLAWED:
        if len(messages) == 1:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [BAD_CALL],
            }
            return Whole(_completion(message))
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


def test_the_agent_solves_the_tool_tasks_through_the_proxy(
    db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    tasks = load_task_set(write_jsonl(TASKS, tmp_path / "tools-train.jsonl"))
    config = RolloutConfig(
        proxy_url=proxy.url,
        command=[sys.executable, "-m", "learner.rollout.tool_tasks.agent", "{prompt}"],
        tasks=tasks,
        database_url=db_url,
        group_size=1,
        concurrency=2,
        timeout=60,
        settle=0.2,
        record_wait=10,
    )
    summary = run_rollout(config)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            runs = {r["task_key"]: r for r in runs_of(conn, rollout_id=summary.rollout_id)}
    finally:
        engine.dispose()
    assert sorted(runs) == sorted(t.id for t in TASKS)
    for task in TASKS:
        run = runs[task.id]
        assert (run["status"], run["reward"], run["stdout"].strip()) == ("ok", 1.0, task.answer)
        (line,) = [x for x in run["stderr"].splitlines() if x.startswith(SUMMARY_PREFIX)]
        counts = json.loads(line.removeprefix(SUMMARY_PREFIX))
        malformed = 1 if task == FLAWED else 0
        assert counts["malformed"] == malformed, run["stderr"]
        assert counts["tool_calls"] == len(task.gold) + malformed
        assert counts["turns"] == len(task.gold) + malformed + 1
