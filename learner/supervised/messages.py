"""A recorded trajectory's conversation as chat-template messages: what its last answered
call was sent plus the reply it got, in whichever API it came, and the tools it offered.

The proxy records each call's request and response in its own API's shape;
store/conversation.py reads them into one message view, and this turns that view into what
`apply_chat_template` takes (OpenAI-style messages, tool calls with their arguments as a
mapping, tools as `{"type": "function", "function": {...}}`). Nothing of the teacher's tokens
is kept: only text, tool calls and tool results. What cannot become a conversation the
student could have had is refused with a reason (a counted drop), never guessed at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from store.conversation import Message, reply_messages, request_messages
from store.json_types import JsonObject, JsonValue
from store.trajectory_record import Trajectory, TrajectoryCall

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ChatFunction(TypedDict):
    name: str
    arguments: JsonObject  # a mapping: chat templates render it (tojson)


class ChatToolCall(TypedDict):
    id: NotRequired[str]
    type: Literal["function"]
    function: ChatFunction


class ChatMessage(TypedDict):
    """One message as chat templates take it."""

    role: str  # system | user | assistant | tool
    content: str
    tool_calls: NotRequired[list[ChatToolCall]]
    tool_call_id: NotRequired[str]


@dataclass(frozen=True)
class Conversation:
    """What the student's template renders: the messages and the function tools offered."""

    call: TrajectoryCall  # the call whose request and reply they are
    messages: list[ChatMessage]
    tools: list[JsonObject]


def last_answered(trajectory: Trajectory) -> TrajectoryCall | None:
    """The trajectory's last call that got a reply: its request holds the conversation so
    far (a failed retry after it adds nothing)."""
    for call in reversed(trajectory.calls):
        if call.status == "ok" and isinstance(call.response, dict):
            return call
    return None


def conversation_of(trajectory: Trajectory) -> Conversation | str:
    """The conversation of the trajectory's last answered call, or why there is none."""
    call = last_answered(trajectory)
    if call is None:
        return "no reply"
    if call.api == "completions":
        return "not a chat (completions API)"  # a raw prompt has no turns to mask
    reply = reply_messages(call.api, call.response, call.id)
    if not any(m["role"] == "assistant" for m in reply):
        return "no reply"
    messages: list[ChatMessage] = []
    for message in request_messages(call.api, call.request) + reply:
        converted = _chat_message(message)
        if isinstance(converted, str):
            return converted
        _append(messages, converted)
    return Conversation(call=call, messages=messages, tools=request_tools(call.api, call.request))


def _chat_message(message: Message) -> ChatMessage | str:
    role = ROLES.get(message["role"]) or ("tool" if message["role"] == "tool" else None)
    if role is None:
        return "unknown role"
    out: ChatMessage = {"role": role, "content": message["text"]}
    if role == "tool" and message["tool_call_id"] is not None:
        out["tool_call_id"] = message["tool_call_id"]
    if message["tool_calls"]:
        if role != "assistant":
            return "unknown role"
        calls: list[ChatToolCall] = []
        for raw in message["tool_calls"]:
            arguments = _mapping(raw["arguments"])
            if not isinstance(raw["name"], str) or not raw["name"] or arguments is None:
                return "malformed tool call"  # never taught: the student would learn it
            call: ChatToolCall = {
                "type": "function",
                "function": {"name": raw["name"], "arguments": arguments},
            }
            if isinstance(raw["id"], str):
                call["id"] = raw["id"]
            calls.append(call)
        out["tool_calls"] = calls
    return out


def _append(messages: list[ChatMessage], message: ChatMessage) -> None:
    """Consecutive assistant messages are one turn (the Responses API gives each function
    call an item of its own): their text and tool calls together."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant" or message["role"] != "assistant":
        messages.append(message)
        return
    texts = [t for t in (last["content"], message["content"]) if t]
    last["content"] = "\n".join(texts)
    calls = last.get("tool_calls", []) + message.get("tool_calls", [])
    if calls:
        last["tool_calls"] = calls


def _mapping(arguments: str) -> JsonObject | None:
    try:
        parsed: JsonValue = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def request_tools(api: str, request: JsonObject | None) -> list[JsonObject]:
    """The function tools a request offered, as chat templates take them; other kinds (a
    provider's built-in search, ...) are left out: the student has none of them."""
    raw = request.get("tools") if isinstance(request, dict) else None
    if not isinstance(raw, list):
        return []
    functions: list[JsonObject] = []
    for tool in raw:
        if not isinstance(tool, dict):
            continue
        if api == "chat.completions" and isinstance(tool.get("function"), dict):
            functions.append(_function(tool["function"], "parameters"))  # type: ignore[arg-type]
        elif api == "messages" and isinstance(tool.get("name"), str):
            functions.append(_function(tool, "input_schema"))
        elif api == "responses" and tool.get("type") == "function":
            functions.append(_function(tool, "parameters"))
        elif api == "gemini":
            declared = tool.get("functionDeclarations") or tool.get("function_declarations")
            for function in declared if isinstance(declared, list) else []:
                if isinstance(function, dict):
                    functions.append(_function(function, "parameters"))
    return [f for f in functions if isinstance(f["function"], dict) and f["function"].get("name")]


def _function(spec: JsonObject, schema_key: str) -> JsonObject:
    function: JsonObject = {"name": spec.get("name")}
    if isinstance(spec.get("description"), str):
        function["description"] = spec["description"]
    schema = spec.get(schema_key)
    function["parameters"] = schema if isinstance(schema, dict) else {"type": "object"}
    return {"type": "function", "function": function}
