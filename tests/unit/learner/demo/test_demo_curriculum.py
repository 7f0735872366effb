"""The demo's curriculum (learner/demo/curriculum.py): its task sets and file, and the
single-turn harness's answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from learner.demo.curriculum import EVAL_TASKS, QA_TRAIN, write_curriculum
from learner.demo.harnesses.qa_agent import answer
from learner.demo.run import DemoConfig
from learner.demo.tasks import DIRECT_KINDS, calculate, make_qa_tasks, make_task_sets
from learner.rollout.curriculum import load_curriculum


def test_qa_tasks_are_one_step_questions_of_their_own(tmp_path: Path) -> None:
    train, heldout = make_task_sets(0, 200, 60)
    excluded = {t["prompt"] for t in train + heldout}
    qa_train, qa_eval = make_qa_tasks(0, 50, 10, exclude=excluded)
    prompts = [t["prompt"] for t in qa_train + qa_eval]
    assert len(set(prompts)) == 60 and not excluded & set(prompts)
    assert {t["metadata"]["kind"] for t in qa_train} == set(DIRECT_KINDS)
    for task in qa_train + qa_eval:
        assert str(int(calculate(task["metadata"]["expression"]))) == task["answer"]
    assert qa_train[0]["id"] == "qa-train-0000" and qa_eval[-1]["id"] == "qa-eval-0009"
    assert make_qa_tasks(0, 50, 10, exclude=excluded) == (qa_train, qa_eval)  # seeded


def test_the_demo_curriculum_file_loads(tmp_path: Path) -> None:
    path, prompts = write_curriculum(tmp_path, DemoConfig(temperature=0.5))
    curriculum = load_curriculum(path)
    qa, tools = curriculum.stages
    assert (qa.name, tools.name) == ("qa", "tools")
    assert (len(qa.tasks.tasks), len(qa.eval.tasks)) == (QA_TRAIN, EVAL_TASKS)
    assert (len(tools.tasks.tasks), len(tools.eval.tasks)) == (200, EVAL_TASKS)
    assert qa.command is not None and "learner.demo.harnesses.qa_agent" in qa.command
    assert tools.command is not None and "learner.demo.harnesses.calc_agent" in tools.command
    assert tools.command[-2:] == ["--temperature", "0.5"] and tools.replay > 0
    # the warm-up must never see any task of it: all of them are in the prompts returned
    every = [
        t.prompt
        for s in curriculum.stages
        for t in [*s.tasks.tasks.values(), *s.eval.tasks.values()]
    ]
    assert set(every) <= set(prompts)


def test_the_single_turn_answer_is_the_reply_or_its_calculation() -> None:
    replies: list[dict[str, Any]] = []

    def complete(messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        assert len(messages) == 1 and sampling["tools"][0]["function"]["name"] == "calculator"
        return replies.pop(0)

    call = {"function": {"name": "calculator", "arguments": json.dumps({"expression": "7 * 12"})}}
    replies += [{"content": "", "tool_calls": [call]}, {"content": "84"}, {"content": None}]
    assert answer(complete, "q") == "84"  # the value of the expression it wrote
    assert answer(complete, "q") == "84"  # its text
    assert answer(complete, "q") == ""
    bad = {"function": {"name": "calculator", "arguments": json.dumps({"expression": "7 *"})}}
    replies.append({"content": "", "tool_calls": [bad]})
    assert answer(complete, "q").startswith("error:")
