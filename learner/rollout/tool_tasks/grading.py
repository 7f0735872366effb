"""The tool tasks' grader: the outcome, i.e. the number the final answer ends with, against
the task's reference.

- 1.0 (right): the last number of the final answer is the reference within TOLERANCE;
- 0.5 (rounded): it is the reference rounded to fewer decimals than the reference has, e.g.
  "27.6" or "28" for 27.56 (right as far as it goes; an integer reference has no such
  answer);
- 0.0 (wrong): another number, no number, or no final answer (the run ended on a reply
  that calls a tool, whatever text it holds beside the call).

Used as `python:learner.rollout.tool_tasks.grading:grade` (every task row names it), which
gets the trajectory in the export format: the task comes from its task key alone
(tasks.task_by_key), so the learner and the rollout runner grade alike without the task
table. A trajectory whose key is no tool task's raises, which the python grader turns into
an error grade (never a zero that would teach anything).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from learner.graders.extract import reply_text
from learner.rollout.tool_tasks.tasks import TOLERANCE, task_by_key

if TYPE_CHECKING:
    from store.export import ExportedTrajectory
    from store.json_types import JsonObject

RIGHT, ROUNDED, WRONG = 1.0, 0.5, 0.0
# a number as people write it: sign, thousands separators, decimals
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


@dataclass(frozen=True)
class Score:
    reward: float
    verdict: str  # right | rounded | wrong | no number | no answer
    found: str | None = None  # the number the answer ended with, as written


def score(text: str | None, answer: str) -> Score:
    """How a final answer `text` scores against the reference `answer` (module docstring)."""
    if text is None or not text.strip():
        return Score(WRONG, "no answer")
    numbers = _NUMBER.findall(text)
    if not numbers:
        return Score(WRONG, "no number")
    found = numbers[-1]
    value, expected = float(found.replace(",", "")), float(answer)
    if abs(value - expected) <= TOLERANCE:
        return Score(RIGHT, "right", found)
    written = _decimals(found)
    if written < _decimals(answer) and abs(value - expected) <= 0.5 * 10**-written + 1e-9:
        return Score(ROUNDED, "rounded", found)
    return Score(WRONG, "wrong", found)


def _decimals(number: str) -> int:
    _, point, fraction = number.partition(".")
    return len(fraction) if point else 0


def final_text(trajectory: ExportedTrajectory) -> str | None:
    """The text of the trajectory's last answered reply; "" when that reply calls a tool, even
    with text beside the call (the run ended on a tool call: no final answer); None when no
    call was answered."""
    for call in reversed(trajectory["calls"]):
        response = call["response"]
        if call["status"] != "ok" or not isinstance(response, dict):
            continue
        text = reply_text(response)
        if text is not None:
            return "" if calls_tools(response) else text
    return None


def calls_tools(response: JsonObject) -> bool:
    """Whether a response body calls a tool, in each shape `reply_text` reads: chat
    completions' `tool_calls`, Responses' `function_call` items, Anthropic's `tool_use`
    blocks (a text completion calls none)."""
    choices = response.get("choices")
    if isinstance(choices, list):
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = first.get("message")
        return isinstance(message, dict) and bool(message.get("tool_calls"))
    output = response.get("output")
    if isinstance(output, list):
        return any(_is_type(item, "function_call") for item in output)
    content = response.get("content")
    return isinstance(content, list) and any(_is_type(block, "tool_use") for block in content)


def _is_type(item: object, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind


def grade(trajectory: ExportedTrajectory) -> float:
    """The `python:` grader: the reward of a tool task's trajectory; ValueError for a
    trajectory that is not one (no task key, or not a tool task's)."""
    key = trajectory["task_key"]
    if key is None:
        raise ValueError("the trajectory has no task key: send the task id (X-Onthejob-Task)")
    task = task_by_key(key)
    return score(final_text(trajectory), task.answer).reward
