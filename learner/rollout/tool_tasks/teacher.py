"""The scripted stand-in teacher of the tool tasks: a deterministic solver that plays a model
which always calls the right tool with the right arguments, one call a turn, and then
answers with the reference.

It is no model: wherever its trajectories or their results appear (the supervised stage's
source, a bench's report), they are named as coming from a stand-in. `ScriptedTeacher.reply`
takes a chat request's messages and gives the next assistant message, so it can sit behind
an OpenAI-style server (a test's fake upstream, the demo's teacher) and be recorded through
the proxy like any upstream; `gold_messages` is the whole conversation it produces for a
task, as a harness sends it back (tool arguments as JSON text).

Which step it is at is read off the conversation: the number of assistant turns since the
question that called a tool. It does not read the tool results (they are the gold calls'
own when the harness runs this family's tools), so it answers the same for any harness.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict

from learner.graders.extract import content_text
from learner.rollout.tool_tasks.tasks import GoldCall, ToolTask

if TYPE_CHECKING:
    from store.json_types import JsonObject


class ToolFunction(TypedDict):
    name: str
    arguments: str  # JSON text, as the API carries it


class ToolCall(TypedDict):
    id: str
    type: str
    function: ToolFunction


class ChatMessage(TypedDict, total=False):
    role: str
    content: str | None
    tool_calls: list[ToolCall]
    tool_call_id: str


class UnknownTask(ValueError):
    """The conversation's question is none of the teacher's tasks."""


def call_id(step: int) -> str:
    return f"call_{step}"


def tool_call_message(call: GoldCall, step: int) -> ChatMessage:
    arguments = json.dumps(call["arguments"], ensure_ascii=False)
    function: ToolFunction = {"name": call["name"], "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id(step), "type": "function", "function": function}],
    }


def answer_message(task: ToolTask) -> ChatMessage:
    return {"role": "assistant", "content": task.answer}


def gold_messages(task: ToolTask) -> list[ChatMessage]:
    """The question, each gold call with its result, the answer: the teacher's trajectory."""
    messages: list[ChatMessage] = [{"role": "user", "content": task.prompt}]
    for step, call in enumerate(task.gold):
        messages.append(tool_call_message(call, step))
        messages.append({"role": "tool", "tool_call_id": call_id(step), "content": call["result"]})
    messages.append(answer_message(task))
    return messages


class ScriptedTeacher:
    def __init__(self, tasks: Iterable[ToolTask]) -> None:
        self._by_prompt = {task.prompt: task for task in tasks}

    def task_of(self, messages: Sequence[JsonObject | ChatMessage]) -> ToolTask:
        """The task whose question the conversation's first user message is, or holds (a
        harness may wrap it in words of its own); UnknownTask if none."""
        question = next((m for m in messages if m.get("role") == "user"), None)
        text = content_text(question.get("content")) if question is not None else ""
        found = self._by_prompt.get(text.strip())
        if found is None:  # the longest prompt it holds: one task's may end another's
            held = [prompt for prompt in self._by_prompt if prompt in text]
            found = self._by_prompt[max(held, key=len)] if held else None
        if found is None:
            raise UnknownTask(f"no task asks {text[:200]!r}")
        return found

    def reply(self, messages: Sequence[JsonObject | ChatMessage]) -> ChatMessage:
        """The next assistant message: the next gold call, or the answer after the last."""
        task = self.task_of(messages)
        step = sum(1 for m in _after_question(messages) if _calls_tools(m))
        if step < len(task.gold):
            return tool_call_message(task.gold[step], step)
        return answer_message(task)


def _after_question(
    messages: Sequence[JsonObject | ChatMessage],
) -> Sequence[JsonObject | ChatMessage]:
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return messages[users[0] + 1 :] if users else messages


def _calls_tools(message: JsonObject | ChatMessage) -> bool:
    return message.get("role") == "assistant" and bool(message.get("tool_calls"))
