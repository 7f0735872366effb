"""learner/rollout/tool_tasks/teacher.py: the scripted stand-in teacher answers each turn
of a tool task with the next gold call, then the reference."""

from __future__ import annotations

import json

import pytest

from learner.rollout.tool_tasks.tasks import ToolTask, make_task_sets
from learner.rollout.tool_tasks.teacher import (
    ChatMessage,
    ScriptedTeacher,
    UnknownTask,
    gold_messages,
)

TRAIN, HELDOUT = make_task_sets(0, 12, 6)
TEACHER = ScriptedTeacher(TRAIN + HELDOUT)
DENSITY = TRAIN[5]  # lookup, lookup, calculator


def test_the_gold_conversation() -> None:
    messages = gold_messages(DENSITY)
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert messages[0]["content"] == DENSITY.prompt
    for step, call in enumerate(DENSITY.gold):
        asked, answered = messages[1 + 2 * step], messages[2 + 2 * step]
        (tool_call,) = asked["tool_calls"]
        assert asked["content"] is None and tool_call["id"] == f"call_{step}"
        assert tool_call["function"]["name"] == call["name"]
        assert json.loads(tool_call["function"]["arguments"]) == call["arguments"]
        assert answered == {
            "role": "tool",
            "tool_call_id": f"call_{step}",
            "content": call["result"],
        }
    assert messages[-1] == {"role": "assistant", "content": DENSITY.answer}


@pytest.mark.parametrize("task", TRAIN + HELDOUT, ids=lambda t: t.id)
def test_turn_by_turn_the_teacher_says_the_gold_conversation(task: ToolTask) -> None:
    gold = gold_messages(task)
    conversation: list[ChatMessage] = [{"role": "system", "content": "Be brief."}, gold[0]]
    for expected, result in zip(gold[1::2], [*gold[2::2], None], strict=True):
        assert TEACHER.reply(conversation) == expected
        conversation += [expected] + ([result] if result else [])


def test_a_question_wrapped_by_a_harness_is_found() -> None:
    wrapped = f"New task:\n{DENSITY.prompt}\nUse your tools."
    assert TEACHER.task_of([{"role": "user", "content": wrapped}]) == DENSITY
    parts = [{"type": "text", "text": DENSITY.prompt}]
    assert TEACHER.task_of([{"role": "user", "content": parts}]) == DENSITY


def test_a_question_it_has_no_task_for_is_refused() -> None:
    with pytest.raises(UnknownTask, match=r"no task asks 'What is the capital of France\?'"):
        TEACHER.reply([{"role": "user", "content": "What is the capital of France?"}])
    with pytest.raises(UnknownTask):
        TEACHER.reply([])
