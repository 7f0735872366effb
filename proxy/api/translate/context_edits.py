"""Anthropic context-management edits, carried out by the proxy on the chat messages it sends.

Pure functions over chat messages. The model sees the edited conversation; the client keeps
its own. Clearing old thinking is cheap and done on every request that asks for it;
clearing old tool results waits for its trigger (a prompt token count, which the caller
measures) and is kept only if it cleared at least what the client asked for.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Required, TypedDict

from proxy.api.translate.shapes import ChatMessage
from store.json_types import JsonObject

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
# what a cleared tool result says instead, so the model knows something was there
CLEARED_RESULT = "[tool result cleared to save context]"
CLEARED_INPUT = "{}"


class AppliedEdit(TypedDict, total=False):
    """One edit as Anthropic reports it, with what it cleared."""

    type: Required[str]
    cleared_thinking_turns: int
    cleared_tool_uses: int
    cleared_input_tokens: int


class AppliedEdits(TypedDict):
    """A Messages answer's `context_management`."""

    applied_edits: list[AppliedEdit]


class ToolUseClearingDetail(TypedDict, total=False):
    """What the record says `clear_tool_uses` did (the Compat detail of its feature)."""

    input_tokens: int | None  # the prompt before; None when it was not counted
    triggered: bool
    cleared_input_tokens: int
    kept: str  # why the messages were kept as they were, though it triggered
    cleared_tool_uses: int
    cleared_tool_use_ids: list[str]


@dataclass(frozen=True)
class ToolUseClearing:
    """`clear_tool_uses_20250919` with Anthropic's defaults."""

    trigger_input_tokens: int | None = 100_000
    trigger_tool_uses: int | None = None
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool = False

    def triggered(self, *, prompt_tokens: int | None, tool_uses: int) -> bool:
        if self.trigger_tool_uses is not None:
            return tool_uses > self.trigger_tool_uses
        return prompt_tokens is not None and prompt_tokens > (self.trigger_input_tokens or 0)


def tool_use_count(messages: list[ChatMessage]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


def clear_thinking(messages: list[ChatMessage], keep: int) -> tuple[list[ChatMessage], int]:
    """Reasoning removed from all but the last `keep` assistant turns that have any;
    returns the messages (copies where changed) and how many turns were cleared."""
    thinking = [
        i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("reasoning")
    ]
    cleared = thinking[: max(len(thinking) - keep, 0)]
    out = list(messages)
    for i in cleared:
        out[i] = {k: v for k, v in messages[i].items() if k != "reasoning"}
    return out, len(cleared)


def clear_tool_uses(
    messages: list[ChatMessage], edit: ToolUseClearing
) -> tuple[list[ChatMessage], list[str]]:
    """The oldest tool results (all but the last `edit.keep` tool uses, excluded tools
    never) replaced by a placeholder; with `clear_inputs`, their calls' arguments too.
    Returns the new messages and the ids of the cleared tool calls, oldest first."""
    calls = [
        call
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if (call.get("function") or {}).get("name") not in edit.exclude_tools
    ]
    cleared = [call.get("id") for call in calls[: max(len(calls) - edit.keep, 0)]]
    ids = {i for i in cleared if i}
    out = []
    for message in messages:
        if message.get("role") == "tool" and message.get("tool_call_id") in ids:
            message = {**message, "content": CLEARED_RESULT}
        elif edit.clear_inputs and message.get("role") == "assistant" and message.get("tool_calls"):
            message = _clear_inputs(message, ids)
        out.append(message)
    return out, [i for i in cleared if i]


def _clear_inputs(message: ChatMessage, ids: set[str]) -> ChatMessage:
    calls = copy.deepcopy(message["tool_calls"])
    for call in calls:
        if call.get("id") in ids:
            call["function"]["arguments"] = CLEARED_INPUT
    return {**message, "tool_calls": calls}


def applied_edits(detail: JsonObject) -> AppliedEdits | None:
    """The response's `context_management` from what the edits did (the record's detail):
    only edits that changed the prompt, as Anthropic reports them."""
    edits: list[AppliedEdit] = []
    thinking = detail.get(f"context_management.{CLEAR_THINKING}") or {}
    if thinking.get("cleared_thinking_turns"):
        edits.append({"type": CLEAR_THINKING, **thinking})
    tools = detail.get(f"context_management.{CLEAR_TOOL_USES}") or {}
    if tools.get("cleared_tool_uses"):
        reported = ("cleared_tool_uses", "cleared_input_tokens")
        edits.append({"type": CLEAR_TOOL_USES, **{k: tools[k] for k in reported if k in tools}})
    return {"applied_edits": edits} if edits else None
