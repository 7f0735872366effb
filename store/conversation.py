"""One conversation view of a trajectory, whatever API its calls spoke (pure functions).

Each message is `{role, text, tool_calls, tool_call_id, call_id, is_error}`; `call_id` names
the call whose reply it is (None for what the client sent); `is_error` marks a tool result
the harness flagged as an error (Messages' `is_error`). A call whose request repeats the
conversation so far adds only its new messages; one that does not starts over, marked by a
`context` message (tool-call arguments count by what they mean: a client may send them back
re-serialised). Recorded requests may be malformed (refused calls are recorded too), so
nothing here assumes a shape: what cannot be read is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import orjson

from store.tool_arguments import canonical_arguments
from store.trajectory_record import TrajectoryCall


class ToolCall(TypedDict):
    """A tool call an assistant message made, whatever API spelt it."""

    id: Any  # as the body gave it: usually a string, never checked
    name: Any
    arguments: str  # JSON text


class Message(TypedDict):
    """One message of the conversation view (a dict: the admin API returns it as it is)."""

    role: str  # system | user | assistant | tool | error | context
    text: str
    tool_calls: list[ToolCall]
    tool_call_id: str | None
    call_id: str | None
    is_error: bool


def _message(
    role: str,
    text: str = "",
    *,
    tool_calls: list[ToolCall] | None = None,
    tool_call_id: str | None = None,
    call_id: str | None = None,
    is_error: bool = False,
) -> Message:
    return {
        "role": role,
        "text": text,
        "tool_calls": tool_calls or [],
        "tool_call_id": tool_call_id,
        "call_id": call_id,
        "is_error": is_error,  # a tool result the harness marked as an error
    }


def _tool_result(
    text: str, tool_call_id: Any, call_id: str | None, *, is_error: bool = False
) -> Message:
    """A tool's result, answering the call `tool_call_id` (kept only when it is a string)."""
    answers = tool_call_id if isinstance(tool_call_id, str) else None
    return _message("tool", text, tool_call_id=answers, call_id=call_id, is_error=is_error)


def _text(content: Any) -> str:
    """Text of a content value: a string, or a list of parts/blocks with text in them."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "tool_result":
                parts.append(_text(part.get("content")))
        return "\n".join(parts)
    return ""


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _chat_tool_calls(raw: Any) -> list[ToolCall]:
    out = []
    for call in raw if isinstance(raw, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(
                {
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": _arguments(function.get("arguments", "")),
                }
            )
    return out


def _chat_message(raw: Any, call_id: str | None = None) -> Message | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
        return None
    return _message(
        raw["role"],
        _text(raw.get("content")),
        tool_calls=_chat_tool_calls(raw.get("tool_calls")),
        tool_call_id=raw.get("tool_call_id") if isinstance(raw.get("tool_call_id"), str) else None,
        call_id=call_id,
    )


def _anthropic_blocks(role: str, content: Any, call_id: str | None) -> list[Message]:
    if isinstance(content, str):
        return [_message(role, content, call_id=call_id)]
    out: list[Message] = []
    text: list[str] = []
    tools: list[ToolCall] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "tool_use":
            tools.append(
                {
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": _arguments(block.get("input", {})),
                }
            )
        elif kind == "tool_result":
            out.append(
                _tool_result(
                    _text(block.get("content")),
                    block.get("tool_use_id"),
                    call_id,
                    is_error=block.get("is_error") is True,
                )
            )
    if text or tools:
        out.insert(0, _message(role, "\n".join(text), tool_calls=tools, call_id=call_id))
    return out


def _responses_items(items: Any, call_id: str | None) -> list[Message]:
    if isinstance(items, str):
        return [_message("user", items, call_id=call_id)]
    out: list[Message] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" and isinstance(item.get("role"), str):
            out.append(_message(item["role"], _text(item.get("content")), call_id=call_id))
        elif kind == "function_call":
            tool: ToolCall = {
                "id": item.get("call_id"),
                "name": item.get("name"),
                "arguments": _arguments(item.get("arguments", "")),
            }
            out.append(_message("assistant", tool_calls=[tool], call_id=call_id))
        elif kind == "function_call_output":
            out.append(_tool_result(_text(item.get("output")), item.get("call_id"), call_id))
    return out


def _gemini_contents(contents: Any, call_id: str | None) -> list[Message]:
    """Gemini `contents`: text and function calls of a turn in one message (role `model` as
    `assistant`), each function response its own `tool` message."""
    out: list[Message] = []
    for content in contents if isinstance(contents, list) else []:
        if not isinstance(content, dict):
            continue
        role = "assistant" if content.get("role") == "model" else "user"
        text: list[str] = []
        tools: list[ToolCall] = []
        for part in content.get("parts") or []:
            if not isinstance(part, dict):
                continue
            call = part.get("functionCall") or part.get("function_call")
            answer = part.get("functionResponse") or part.get("function_response")
            if isinstance(part.get("text"), str) and not part.get("thought"):
                text.append(part["text"])
            elif isinstance(call, dict):
                arguments = _arguments(call.get("args", {}))
                tools.append(
                    {"id": call.get("id"), "name": call.get("name"), "arguments": arguments}
                )
            elif isinstance(answer, dict):
                result = _arguments(answer.get("response", {}))
                out.append(_tool_result(result, answer.get("id"), call_id))
        if text or tools:
            out.append(_message(role, "".join(text), tool_calls=tools, call_id=call_id))
    return out


def request_messages(api: str, request: Any) -> list[Message]:
    """What the client sent, as messages."""
    if not isinstance(request, dict):
        return []
    if api == "chat.completions":
        found = [_chat_message(m) for m in request.get("messages") or []]
        return [m for m in found if m is not None]
    if api == "completions":
        prompt = request.get("prompt")
        return [_message("user", prompt if isinstance(prompt, str) else _arguments(prompt))]
    if api == "messages":
        out = []
        if request.get("system"):
            out.append(_message("system", _text(request["system"])))
        for raw in request.get("messages") or []:
            if isinstance(raw, dict) and isinstance(raw.get("role"), str):
                out += _anthropic_blocks(raw["role"], raw.get("content"), None)
        return out
    if api == "responses":
        out = []
        if isinstance(request.get("instructions"), str):
            out.append(_message("system", request["instructions"]))
        return out + _responses_items(request.get("input"), None)
    if api == "gemini":
        system = request.get("systemInstruction") or request.get("system_instruction")
        out = [_message("system", _text(system.get("parts")))] if isinstance(system, dict) else []
        return out + _gemini_contents(request.get("contents"), None)
    return []


def reply_messages(api: str, response: Any, call_id: str) -> list[Message]:
    """What the model answered (first choice), as messages."""
    if not isinstance(response, dict):
        return []
    if api in ("chat.completions", "completions"):
        choices = response.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(first, dict):
            return []
        if api == "completions":
            text = first.get("text")
            return [_message("assistant", text if isinstance(text, str) else "", call_id=call_id)]
        reply = _chat_message(first.get("message"), call_id)
        return [] if reply is None else [reply]
    if api == "messages":
        return _anthropic_blocks("assistant", response.get("content"), call_id)
    if api == "responses":
        return _responses_items(response.get("output"), call_id)
    if api == "gemini":
        candidates = response.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates else None
        content = first.get("content") if isinstance(first, dict) else None
        return _gemini_contents([content], call_id) if isinstance(content, dict) else []
    return []


def _same(a: Message, b: Message) -> bool:
    """The same message, whichever call it came in (`call_id`) and however flagged, and
    however the client spelt its tool calls' arguments back (store/tool_arguments.py)."""
    return (a["role"], a["text"], a["tool_call_id"]) == (
        b["role"],
        b["text"],
        b["tool_call_id"],
    ) and (  # parsed only when the text differs: the usual echo is byte for byte
        a["tool_calls"] == b["tool_calls"]
        or _calls_meant(a["tool_calls"]) == _calls_meant(b["tool_calls"])
    )


def _calls_meant(calls: list[ToolCall]) -> list[tuple[Any, Any, Any]]:
    return [(c["id"], c["name"], canonical_arguments(c["arguments"])) for c in calls]


def conversation(calls: Sequence[TrajectoryCall]) -> list[Message]:
    """The trajectory's conversation from its calls, in order."""
    out: list[Message] = []
    seen: list[Message] = []  # the conversation as the next request would repeat it
    for call in calls:
        sent = request_messages(call.api, call.request)
        prefix = len(seen) <= len(sent) and all(
            _same(a, b) for a, b in zip(seen, sent, strict=False)
        )
        if not prefix:
            out.append(_message("context", "a new context starts here", call_id=call.id))
            seen = []
        out += sent[len(seen) :]
        reply = reply_messages(call.api, call.response, call.id)
        if call.error:
            out.append(_message("error", str(call.error), call_id=call.id))
        out += reply
        seen = sent + reply
    return out
