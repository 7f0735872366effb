"""Text out of a trajectory: the final answer and the task's prompt.

Understands every API the proxy records (chat completions, completions, Responses,
Anthropic Messages) by the shape of the body, so hand-written trajectories work too.
"""

from __future__ import annotations

from typing import Any

from store.json_types import JsonObject
from store.trajectory_record import Trajectory

# Part types that carry plain text in the three chat-like APIs.
_TEXT_PARTS = {"text", "input_text", "output_text"}


def final_answer(trajectory: Trajectory) -> str | None:
    """The text of the last assistant reply: the last call that succeeded decides, even when
    it holds only tool calls ("" then); None when no call has a readable response."""
    for call in reversed(trajectory.calls):
        if call.status != "ok" or not isinstance(call.response, dict):
            continue
        text = reply_text(call.response)
        if text is not None:
            return text
    return None


def reply_text(response: JsonObject) -> str | None:
    """The assistant text of one response body in any recorded API shape, else None."""
    if isinstance(response.get("choices"), list):
        return _choice_text(response["choices"])
    if isinstance(response.get("output"), list):  # Responses API
        messages = [item for item in response["output"] if _is_type(item, "message")]
        return "\n".join(content_text(item.get("content")) for item in messages)
    if isinstance(response.get("content"), list):  # Anthropic Messages
        return content_text(response["content"])
    return None


def task_prompt(trajectory: Trajectory) -> str | None:
    """The first user message of the first call: what the agent was asked to do."""
    calls = trajectory.calls
    request = calls[0].request if calls else None
    if not isinstance(request, dict):
        return None
    if isinstance(request.get("prompt"), str):  # completions
        return request["prompt"]
    turns = request.get("messages")
    if turns is None:  # Responses API: "input" is a string or a list of items
        turns = request.get("input")
        if isinstance(turns, str):
            return turns
    for turn in turns if isinstance(turns, list) else []:
        if isinstance(turn, dict) and turn.get("role") == "user":
            return content_text(turn.get("content"))
    return None


def content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") in _TEXT_PARTS]
    return "".join(p for p in parts if isinstance(p, str))


def _choice_text(choices: list[Any]) -> str | None:
    first = choices[0] if choices and isinstance(choices[0], dict) else None
    if first is None:
        return None
    if isinstance(first.get("message"), dict):  # chat completions
        return content_text(first["message"].get("content"))
    text = first.get("text")  # completions
    return text if isinstance(text, str) else None


def _is_type(item: Any, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind
