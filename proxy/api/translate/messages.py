"""Anthropic Messages API <-> chat completions, so `/v1/messages` rides vLLM's chat endpoint.

Pure functions over parsed JSON, no I/O. Invariant: every part of a Messages request is
mapped onto the chat request, handled by the compatibility policy (proxy/base/compat_policy.py:
honoured, ignored, left out, unknown; recorded in the `Compat` passed in) or refused with a
`TranslationError` that names it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Required, TypeAlias, TypedDict

from proxy.api.translate import context_edits
from proxy.api.translate.context_edits import AppliedEdits
from proxy.api.translate.extras import VLLM_EXTRAS, vllm_extras
from proxy.api.translate.shapes import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatDelta,
    ChatFunction,
    ChatMessage,
    ChatRequest,
    ChatTool,
    ChatToolCall,
    ChatToolChoice,
    ChatUsage,
    ChunkChoice,
    ToolCallDelta,
)
from proxy.base.capture import REASONING_KEYS
from proxy.base.compat_policy import Compat, unmapped_fields
from store.json_types import JsonObject

_MAPPED_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "context_management",
        "mcp_servers",
        *VLLM_EXTRAS,
    }
)
# Accepted and not forwarded, because none of them changes what the model reads or writes:
# cache_control (a caching hint; vLLM's prefix cache needs none), service_tier, speed and
# inference_geo (Anthropic capacity and routing), diagnostics (explains Anthropic's own cache
# misses), user_profile_id and workspace_id (Anthropic account attribution), container
# (the sandbox of Anthropic's code-execution tool, which is left out).
_VENDOR_FIELDS = frozenset(
    {
        "cache_control",
        "service_tier",
        "speed",
        "inference_geo",
        "diagnostics",
        "user_profile_id",
        "workspace_id",
        "container",
    }
)
# vLLM's reasoning_effort values; Anthropic's effort levels are among them
_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
# Keys each content block may carry; cache_control is a caching hint (ignored), any other
# key is recorded as unknown.
_BLOCK_KEYS = {
    "text": frozenset({"type", "text", "citations"}),
    "tool_use": frozenset({"type", "id", "name", "input"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
}
_TOOL_KEYS = frozenset(
    {"type", "name", "description", "input_schema", "strict", "defer_loading", "input_examples"}
)
# Tool keys that only matter to Anthropic's servers: caching, input streaming granularity,
# and which of Anthropic's server tools may call this one.
_VENDOR_TOOL_KEYS = frozenset({"cache_control", "eager_input_streaming", "allowed_callers"})
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# The chat request fields that decide the rendered prompt (what count_tokens counts).
_PROMPT_FIELDS = (
    "model",
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
)
_NUMBER = (int, float)


# --- the Messages answer's shapes (what this module builds; a request stays JsonObject) ----


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    """Anthropic's error shape: an error response's body, an `error` event's data."""

    type: str  # "error"
    error: ErrorDetail


class TextBlock(TypedDict):
    type: str  # "text"
    text: str


class ThinkingBlock(TypedDict):
    type: str  # "thinking"
    thinking: str
    signature: str  # always "": we never sign reasoning


class ToolUseBlock(TypedDict):
    type: str  # "tool_use"
    id: str
    name: str
    input: JsonObject  # the call's arguments


ContentBlock: TypeAlias = TextBlock | ThinkingBlock | ToolUseBlock


class MessageUsage(TypedDict, total=False):
    input_tokens: int
    output_tokens: int


class Message(TypedDict, total=False):
    """A Messages API answer (and, in `message_start`, its opening state)."""

    id: Required[str]
    type: Required[str]  # "message"
    role: Required[str]  # "assistant"
    model: Required[str]
    content: Required[list[ContentBlock]]
    stop_reason: Required[str | None]
    stop_sequence: Required[str | None]
    usage: Required[MessageUsage]
    context_management: AppliedEdits


class TextDelta(TypedDict):
    type: str  # "text_delta"
    text: str


class ThinkingDelta(TypedDict):
    type: str  # "thinking_delta"
    thinking: str


class InputJsonDelta(TypedDict):
    type: str  # "input_json_delta"
    partial_json: str


BlockDelta: TypeAlias = TextDelta | ThinkingDelta | InputJsonDelta


class MessageDelta(TypedDict):
    stop_reason: str
    stop_sequence: str | None


class StreamEvent(TypedDict, total=False):
    """The data of a stream event; which keys it has depends on its type."""

    type: Required[str]
    message: Message  # message_start
    index: int  # content_block_start, _delta, _stop
    content_block: ContentBlock  # content_block_start
    delta: BlockDelta | MessageDelta  # content_block_delta, message_delta
    usage: MessageUsage  # message_delta
    context_management: AppliedEdits  # message_delta


# (event name, its data) as the stream sends them
Event: TypeAlias = tuple[str, StreamEvent | ErrorBody]


class TranslationError(Exception):
    """Client error: becomes a 400 in Anthropic's error shape."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


def error_body(message: str, type_: str = "invalid_request_error") -> ErrorBody:
    """Anthropic's error shape: the body of an error response and the data of an `error` event."""
    return {"type": "error", "error": {"type": type_, "message": message}}


# --- request: Messages -> chat completions --------------------------------------------------


def messages_to_chat(
    body: JsonObject, *, compat: Compat | None = None, hosted_tools: str = "omit"
) -> ChatRequest:
    """The chat completions request for a Messages request; raises TranslationError.

    `compat` collects what the policy did; `hosted_tools` is `omit` (tools the model cannot
    be given are left out) or `refuse` (they are a 400). Clearing old tool results waits
    for a token count: see `tool_use_clearing`.
    """
    compat = compat if compat is not None else Compat()
    chat = _translate(body, compat, hosted_tools)
    chat["max_tokens"] = _max_tokens(body, required=True)
    return chat


def count_tokens_chat_body(body: JsonObject, *, hosted_tools: str = "omit") -> ChatRequest:
    """The chat request whose rendered prompt `/v1/messages/count_tokens` counts.

    Validated like `messages_to_chat` (so both accept the same requests) except that
    `max_tokens` is optional; only the fields that shape the prompt are kept.
    """
    chat = _translate(body, Compat(), hosted_tools)
    _max_tokens(body, required=False)
    return {key: chat[key] for key in _PROMPT_FIELDS if key in chat}


def tool_use_clearing(body: JsonObject) -> context_edits.ToolUseClearing | None:
    """The request's `clear_tool_uses` edit, if any (validated by `messages_to_chat`)."""
    edits = (body.get("context_management") or {}).get("edits") or []
    for i, edit in enumerate(edits):
        if edit.get("type") == context_edits.CLEAR_TOOL_USES:
            return _tool_use_clearing(edit, f"context_management.edits.{i}")
    return None


def _translate(body: JsonObject, compat: Compat, hosted_tools: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise TranslationError("the request body must be a JSON object")
    unmapped_fields(body, handled=_MAPPED_FIELDS, vendor_only=_VENDOR_FIELDS, compat=compat)
    chat: ChatRequest = {"model": _model(body), "messages": _chat_messages(body, compat)}
    keep_thinking = _context_management(body, compat)
    if keep_thinking is not None:
        chat["messages"], cleared = context_edits.clear_thinking(chat["messages"], keep_thinking)
        feature = f"context_management.{context_edits.CLEAR_THINKING}"
        compat.detail[feature] = {"cleared_thinking_turns": cleared}
    _mcp_servers(body, compat, hosted_tools)
    tools = _chat_tools(body, compat, hosted_tools)
    if tools:  # vLLM refuses an empty `tools` list; Anthropic treats it as no tools
        chat["tools"] = tools
    chat.update(_tool_choice(body, names={t["function"]["name"] for t in tools}))
    chat.update(_sampling(body, compat))
    chat.update(_output_config(body, compat))
    chat.update(vllm_extras(body))
    template_kwargs = _thinking(body, compat)
    if template_kwargs:  # the client's own chat_template_kwargs win
        chat["chat_template_kwargs"] = {
            **template_kwargs,
            **(chat.get("chat_template_kwargs") or {}),
        }
    if _ends_with_assistant(body):
        # Anthropic "prefill": the reply continues the final assistant turn.
        chat["add_generation_prompt"] = False
        chat["continue_final_message"] = True
    stream = _optional(body, "stream", bool, "a boolean")
    if stream is not None:
        chat["stream"] = stream
    return chat


def _thinking(body: JsonObject, compat: Compat) -> JsonObject:
    """`thinking` as the chat template's reasoning switch (templates without one ignore it:
    vLLM passes a template only the variables it uses)."""
    thinking = _optional(body, "thinking", dict, "an object")
    if thinking is None:
        return {}
    kind = thinking.get("type")
    # budget_tokens: vLLM enforces a thinking budget only with a reasoning config the proxy
    # cannot see, and max_tokens bounds the reply anyway; display: how the client shows it
    for key in ("budget_tokens", "display"):
        if thinking.get(key) is not None:
            compat.note("ignored", f"thinking.{key}")
    if kind in ("enabled", "adaptive", "disabled"):
        compat.note("honoured", "thinking")
        return {"enable_thinking": kind != "disabled"}
    compat.note("unknown", "thinking.type")
    return {}


def _context_management(body: JsonObject, compat: Compat) -> int | None:
    """Validates the edits; returns how many thinking turns to keep, if thinking is cleared.
    Edits that keep everything change nothing (ignored); unknown kinds are recorded."""
    config = _optional(body, "context_management", dict, "an object")
    if config is None:
        return None
    edits = _optional(config, "edits", list, "a list of edits", where="context_management")
    keep_thinking = None
    for i, edit in enumerate(edits or []):
        where = f"context_management.edits.{i}"
        if not isinstance(edit, dict):
            raise TranslationError(f"{where}: expected an object", param=where)
        kind = edit.get("type")
        feature = f"context_management.{kind}"
        if kind == context_edits.CLEAR_THINKING:
            keep_thinking = _thinking_turns(edit.get("keep"), where)
            compat.note("ignored" if keep_thinking is None else "honoured", feature)
        elif kind == context_edits.CLEAR_TOOL_USES:
            _tool_use_clearing(edit, where)  # carried out once the prompt is counted
            compat.note("honoured", feature)
        else:
            compat.note("unknown", feature)
    return keep_thinking


def _thinking_turns(keep: Any, where: str) -> int | None:
    if keep == "all":
        return None
    if keep is None:
        return 1  # Anthropic's default: the last thinking turn stays
    kind, value = (keep.get("type"), keep.get("value")) if isinstance(keep, dict) else (None, None)
    if kind != "thinking_turns" or not isinstance(value, int) or value < 0:
        raise TranslationError(
            f"{where}.keep: expected 'all' or {{'type': 'thinking_turns', 'value': N}}",
            param=f"{where}.keep",
        )
    return value


def _tool_use_clearing(edit: JsonObject, where: str) -> context_edits.ToolUseClearing:
    trigger = _amount(edit, "trigger", ("input_tokens", "tool_uses"), where)
    keep = _amount(edit, "keep", ("tool_uses",), where)
    least = _amount(edit, "clear_at_least", ("input_tokens",), where)
    exclude = _optional(edit, "exclude_tools", list, "a list of tool names", where=where)
    inputs = edit.get("clear_tool_inputs")
    if inputs is not None and not isinstance(inputs, bool):
        raise TranslationError(
            f"{where}.clear_tool_inputs: expected a boolean", param=f"{where}.clear_tool_inputs"
        )
    clearing = context_edits.ToolUseClearing(
        keep=keep[1] if keep else context_edits.ToolUseClearing.keep,
        clear_at_least=least[1] if least else 0,
        exclude_tools=frozenset(str(name) for name in exclude or []),
        clear_inputs=bool(inputs),
    )
    if trigger is None:
        return clearing
    if trigger[0] == "tool_uses":
        return dataclasses.replace(
            clearing, trigger_input_tokens=None, trigger_tool_uses=trigger[1]
        )
    return dataclasses.replace(clearing, trigger_input_tokens=trigger[1])


def _amount(
    edit: JsonObject, key: str, kinds: tuple[str, ...], where: str
) -> tuple[str, int] | None:
    """An edit's `{"type": kind, "value": N}` field."""
    value = edit.get(key)
    if value is None:
        return None
    number = value.get("value") if isinstance(value, dict) else None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in kinds or not isinstance(number, int) or isinstance(number, bool) or number < 0:
        expected = " or ".join(f"{{'type': '{k}', 'value': N}}" for k in kinds)
        raise TranslationError(f"{where}.{key}: expected {expected}", param=f"{where}.{key}")
    return kind, number


def _model(body: JsonObject) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError("model: field required (a non-empty string)", param="model")
    return model


def _max_tokens(body: JsonObject, *, required: bool) -> int | None:
    value = body.get("max_tokens")
    if value is None and not required:
        return None
    if value is None:
        raise TranslationError("max_tokens: field required", param="max_tokens")
    # Anthropic's 0 pre-warms its prompt cache without generating; vLLM needs at least 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TranslationError("max_tokens: expected an integer >= 1", param="max_tokens")
    return value


def _optional(container: JsonObject, key: str, kinds: Any, what: str, *, where: str = "") -> Any:
    """`container[key]` if present and of `kinds` (bools are not numbers), else None."""
    value = container.get(key)
    if value is None:
        return None
    param = f"{where}.{key}" if where else key
    if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is not bool):
        raise TranslationError(f"{param}: expected {what}", param=param)
    return value


def _sampling(body: JsonObject, compat: Compat) -> ChatRequest:
    fields = {
        "temperature": _optional(body, "temperature", _NUMBER, "a number"),
        "top_p": _optional(body, "top_p", _NUMBER, "a number"),
        "top_k": _optional(body, "top_k", int, "an integer"),
        "stop": _stop_sequences(body),
        "user": _user_id(body, compat),
    }
    return {key: value for key, value in fields.items() if value is not None}


def _stop_sequences(body: JsonObject) -> list[str] | None:
    stops = _optional(body, "stop_sequences", list, "a list of strings")
    if stops is not None and not all(isinstance(stop, str) for stop in stops):
        raise TranslationError("stop_sequences: expected a list of strings", param="stop_sequences")
    return stops or None


def _user_id(body: JsonObject, compat: Compat) -> str | None:
    """metadata.user_id as chat's `user` (which vLLM ignores: metadata is Anthropic's)."""
    metadata = _optional(body, "metadata", dict, "an object")
    if metadata is None:
        return None
    if metadata:
        compat.note("ignored", "metadata")
    return _optional(metadata, "user_id", str, "a string", where="metadata")


def _output_config(body: JsonObject, compat: Compat) -> ChatRequest:
    config = _optional(body, "output_config", dict, "an object")
    if config is None:
        return {}
    unmapped_fields(
        config,
        handled=frozenset({"format", "effort"}),
        vendor_only=frozenset(),
        compat=compat,
        where="output_config",
    )
    chat = _response_format(config.get("format"))
    effort = config.get("effort")
    if effort in _EFFORTS:
        compat.note("honoured", "output_config.effort")
        chat["reasoning_effort"] = effort
    elif effort is not None:
        compat.note("unknown", "output_config.effort")
    return chat


def _response_format(fmt: Any) -> ChatRequest:
    if fmt is None:
        return {}
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise TranslationError(
            "output_config.format: expected {'type': 'json_schema', 'schema': {...}}",
            param="output_config.format",
        )
    schema = _optional(fmt, "schema", dict, "an object", where="output_config.format")
    if schema is None:
        raise TranslationError(
            "output_config.format.schema: field required", param="output_config.format.schema"
        )
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    }


def _ends_with_assistant(body: JsonObject) -> bool:
    last = body["messages"][-1]
    return last.get("role") == "assistant"


# --- request: conversation ----------------------------------------------------------------


def _chat_messages(body: JsonObject, compat: Compat) -> list[ChatMessage]:
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise TranslationError("messages: expected a non-empty list of turns", param="messages")
    chat = _system_messages(body.get("system"), compat)
    for i, turn in enumerate(turns):
        chat.extend(_turn(turn, f"messages.{i}", compat))
    return chat


def _system_messages(system: Any, compat: Compat) -> list[ChatMessage]:
    if system is None:
        return []
    text = _plain_text(system, "system", compat)
    # An empty system prompt means none in Anthropic's API; templates may render "" otherwise.
    return [{"role": "system", "content": text}] if text else []


def _turn(turn: Any, where: str, compat: Compat) -> list[ChatMessage]:
    if not isinstance(turn, dict):
        raise TranslationError(f"{where}: expected an object with role and content", param=where)
    role, content = turn.get("role"), turn.get("content")
    if role == "user":
        return _user_turn(content, where, compat)
    if role == "assistant":
        return [_assistant_turn(content, where, compat)]
    if role == "system":  # newer SDKs allow inline system turns; kept in place
        return [{"role": "system", "content": _plain_text(content, f"{where}.content", compat)}]
    raise TranslationError(
        f"{where}.role: expected 'user' or 'assistant', got {role!r}", param=f"{where}.role"
    )


def _blocks(content: Any, where: str, compat: Compat) -> list[JsonObject]:
    """A content field as a list of typed blocks (a string is one text block); they are the
    client's, so their keys stay open (unknown ones are the policy's to record)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise TranslationError(f"{where}: expected a string or a list of blocks", param=where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise TranslationError(
                f"{where}.{j}: expected a block with a type", param=f"{where}.{j}"
            )
        known = _BLOCK_KEYS.get(block["type"])
        if known is not None:
            unmapped_fields(
                block,
                handled=known,
                vendor_only=frozenset({"cache_control"}),
                compat=compat,
                where=f"{where}.{j}",
            )
    return content


def _unsupported(block: JsonObject, where: str, allowed: str) -> TranslationError:
    return TranslationError(
        f"{where}.type: {block['type']!r} blocks are not supported here by this proxy "
        f"(supported: {allowed})",
        param=f"{where}.type",
    )


def _text(block: JsonObject, where: str) -> str:
    if block.get("citations"):
        raise TranslationError(
            f"{where}.citations: citations are not supported by this proxy",
            param=f"{where}.citations",
        )
    text = block.get("text")
    if not isinstance(text, str):
        raise TranslationError(f"{where}.text: expected a string", param=f"{where}.text")
    return text


def _plain_text(content: Any, where: str, compat: Compat) -> str:
    """Content that may only hold text; several blocks are joined by newlines."""
    texts = []
    for j, block in enumerate(_blocks(content, where, compat)):
        if block["type"] != "text":
            raise _unsupported(block, f"{where}.{j}", "text")
        texts.append(_text(block, f"{where}.{j}"))
    return "\n".join(texts)


def _user_turn(content: Any, where: str, compat: Compat) -> list[ChatMessage]:
    """A user turn in block order: tool results become `tool` messages, text between them
    becomes user messages (chat templates expect tool messages right after the call)."""
    chat: list[ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(_blocks(content, f"{where}.content", compat)):
        at = f"{where}.content.{j}"
        if block["type"] == "text":
            texts.append(_text(block, at))
        elif block["type"] == "tool_result":
            chat.extend(_user_message(texts))
            chat.append(_tool_message(block, at, compat))
            texts = []
        else:
            raise _unsupported(block, at, "text, tool_result")
    chat.extend(_user_message(texts))
    return chat or [{"role": "user", "content": ""}]


def _user_message(texts: list[str]) -> list[ChatMessage]:
    return [{"role": "user", "content": "\n".join(texts)}] if texts else []


def _tool_message(block: JsonObject, where: str, compat: Compat) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise TranslationError(f"{where}.tool_use_id: field required", param=f"{where}.tool_use_id")
    content = block.get("content")
    text = "" if content is None else _plain_text(content, f"{where}.content", compat)
    if block.get("is_error"):
        # Chat has no error flag on tool messages; the model learns it from the text.
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant_turn(content: Any, where: str, compat: Compat) -> ChatMessage:
    """An assistant turn as one chat message; text blocks are joined (chat keeps no order
    between text and tool calls) and thinking goes to `reasoning`, as vLLM reads it."""
    texts: list[str] = []
    calls: list[ChatToolCall] = []
    thoughts: list[str] = []
    for j, block in enumerate(_blocks(content, f"{where}.content", compat)):
        at = f"{where}.content.{j}"
        if block["type"] == "text":
            texts.append(_text(block, at))
        elif block["type"] == "tool_use":
            calls.append(_tool_call(block, at))
        elif block["type"] == "thinking":
            thoughts.append(_thought(block, at))
        else:
            raise _unsupported(block, at, "text, tool_use, thinking")
    message: ChatMessage = {
        "role": "assistant",
        "content": "\n".join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning"] = "\n".join(thoughts)
    return message


def _tool_call(block: JsonObject, where: str) -> ChatToolCall:
    call_id = _required_str(block, "id", where)
    name = _required_str(block, "name", where)
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise TranslationError(f"{where}.input: expected an object", param=f"{where}.input")
    # ensure_ascii=False matches how vLLM's tool parsers serialise arguments, so an echoed
    # call has the same arguments string as the reply it came from (trajectory stitching).
    dumped = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": dumped}}


def _thought(block: JsonObject, where: str) -> str:
    thinking = block.get("thinking")
    if not isinstance(thinking, str):
        raise TranslationError(f"{where}.thinking: expected a string", param=f"{where}.thinking")
    return thinking


def _required_str(block: JsonObject, key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str) or not value:
        raise TranslationError(f"{where}.{key}: field required", param=f"{where}.{key}")
    return value


# --- request: tools -----------------------------------------------------------------------


def _mcp_servers(body: JsonObject, compat: Compat, hosted_tools: str) -> None:
    """Anthropic's MCP connector: servers Anthropic calls for the model, a hosted tool."""
    servers = _optional(body, "mcp_servers", list, "a list of servers")
    if not servers:
        return
    if hosted_tools == "refuse":
        raise TranslationError(
            "mcp_servers: MCP servers called by the API server are not supported by this "
            "proxy; run them as client tools",
            param="mcp_servers",
        )
    compat.note("left_out", "mcp_servers")


def _chat_tools(body: JsonObject, compat: Compat, hosted_tools: str) -> list[ChatTool]:
    """The function tools the model is shown, in order."""
    tools = _optional(body, "tools", list, "a list of tools")
    chat: list[ChatTool] = []
    for i, tool in enumerate(tools or []):
        function = _chat_tool(tool, f"tools.{i}", compat, hosted_tools)
        if function is not None:
            chat.append(function)
    return chat


def _chat_tool(tool: Any, where: str, compat: Compat, hosted_tools: str) -> ChatTool | None:
    """A client tool as a chat function; None for one the model is not shown."""
    if not isinstance(tool, dict):
        raise TranslationError(f"{where}: expected an object", param=where)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        # server tools, and Anthropic-defined tools (bash, text_editor, computer, memory)
        # whose schema the request does not carry: the served model cannot be given them
        if hosted_tools == "refuse":
            raise TranslationError(
                f"{where}.type: server tool {kind!r} is not supported by this proxy; "
                "only client tools (name, description, input_schema) are",
                param=f"{where}.type",
            )
        compat.note("left_out", str(kind))
        return None
    unmapped_fields(
        tool, handled=_TOOL_KEYS, vendor_only=_VENDOR_TOOL_KEYS, compat=compat, where=where
    )
    function: ChatFunction = {"name": _required_str(tool, "name", where)}
    description = _optional(tool, "description", str, "a string", where=where)
    examples = _optional(tool, "input_examples", list, "a list of objects", where=where)
    if examples:
        # Anthropic shows the model these examples; so does the description here
        compat.note("honoured", f"{where}.input_examples")
        shown = "\n".join(json.dumps(example, ensure_ascii=False) for example in examples)
        description = f"{description or ''}\n\nInput examples:\n{shown}".lstrip()
    if description is not None:
        function["description"] = description
    schema = _optional(tool, "input_schema", dict, "an object", where=where)
    if schema is None:
        raise TranslationError(
            f"{where}.input_schema: field required", param=f"{where}.input_schema"
        )
    function["parameters"] = schema
    strict = _optional(tool, "strict", bool, "a boolean", where=where)
    if strict is not None:
        function["strict"] = strict
    if _optional(tool, "defer_loading", bool, "a boolean", where=where):
        # as on Anthropic's servers: a deferred tool is not shown until the client loads it
        compat.note("honoured", f"{where}.defer_loading")
        return None
    return {"type": "function", "function": function}


def _tool_choice(body: JsonObject, *, names: set[str]) -> ChatRequest:
    choice = _optional(body, "tool_choice", dict, "an object")
    if choice is None:
        return {}
    kind = choice.get("type")
    if isinstance(kind, str) and kind in _TOOL_CHOICES:
        value: ChatToolChoice = _TOOL_CHOICES[kind]
    elif kind == "tool":
        name = _required_str(choice, "name", "tool_choice")
        if name not in names:
            raise TranslationError(
                f"tool_choice.name: {name!r} is not a tool the model is given "
                "(server tools and deferred tools are not)",
                param="tool_choice.name",
            )
        value = {"type": "function", "function": {"name": name}}
    else:
        raise TranslationError(
            f"tool_choice.type: expected 'auto', 'any', 'tool' or 'none', got {kind!r}",
            param="tool_choice.type",
        )
    if not names:
        # Without tools, auto and none mean the same as no choice; vLLM refuses them anyway.
        if kind in ("auto", "none"):
            return {}
        raise TranslationError(f"tool_choice: {kind!r} needs tools", param="tool_choice")
    chat: ChatRequest = {"tool_choice": value}
    if _optional(choice, "disable_parallel_tool_use", bool, "a boolean", where="tool_choice"):
        chat["parallel_tool_calls"] = False
    return chat


# --- response: chat completion -> Message -------------------------------------------------


def chat_to_message(
    chat: ChatCompletion, *, model: str, context_management: AppliedEdits | None = None
) -> Message:
    """The Messages response for a whole chat completion (its choice 0).

    A tool call whose arguments are not a JSON object gets `input: {}`: Anthropic's input
    must be an object, and the client's tool then rejects the call, which the model sees.
    `context_management` reports the context edits the proxy applied (`applied_edits`).
    """
    choice = _first_choice(chat)
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    content = [
        *_thinking_blocks(message),
        *_text_blocks(message.get("content")),
        *(_tool_use_block(call) for call in calls),
    ]
    reason, sequence = _stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), tool_used=bool(calls)
    )
    usage = chat.get("usage") or {}
    answer: Message = {
        "id": _message_id(chat.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        # Anthropic answers an empty completion with one empty text block, not [].
        "content": content or [{"type": "text", "text": ""}],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": _count(usage, "prompt_tokens"),
            "output_tokens": _count(usage, "completion_tokens"),
        },
    }
    if context_management:
        answer["context_management"] = context_management
    return answer


def _first_choice(chat: ChatCompletion) -> ChatChoice:
    choices = [c for c in chat.get("choices") or [] if isinstance(c, dict)]
    if not choices:
        raise ValueError("the upstream chat completion has no choices")
    return next((c for c in choices if c.get("index", 0) == 0), choices[0])


def _reasoning(container: ChatMessage | ChatDelta) -> str:
    # Servers may send the same text under both names; take one.
    return next((container[key] for key in REASONING_KEYS if container.get(key)), "")


def _thinking_blocks(message: ChatMessage) -> list[ThinkingBlock]:
    text = _reasoning(message)
    return [{"type": "thinking", "thinking": text, "signature": ""}] if text else []


def _text_blocks(content: Any) -> list[TextBlock]:
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _tool_use_block(call: ChatToolCall) -> ToolUseBlock:
    function = call.get("function") or {}
    return {
        "type": "tool_use",
        "id": call.get("id") or _tool_id(),
        "name": function.get("name") or "",
        "input": _tool_input(function.get("arguments")),
    }


def _tool_input(arguments: Any) -> JsonObject:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _stop_reason(finish_reason: Any, matched: Any, *, tool_used: bool) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat choice's finish."""
    if finish_reason == "length":
        return "max_tokens", None
    # A forced (named) tool call finishes with "stop", so the calls themselves decide.
    if tool_used:
        return "tool_use", None
    # vLLM puts a matched stop string in `stop_reason`; an int there is a stop token id.
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def _message_id(chat_id: Any) -> str:
    if isinstance(chat_id, str) and chat_id:
        return "msg_" + chat_id.removeprefix("chatcmpl-")
    return "msg_" + uuid.uuid4().hex


def _tool_id() -> str:
    return "toolu_" + uuid.uuid4().hex


def _count(usage: ChatUsage, key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) else 0


# --- response: chunk stream -> event stream -----------------------------------------------


def _event(name: str, **fields: Any) -> Event:
    return name, {"type": name, **fields}


class MessagesStream:
    """Turns vLLM chat.completion.chunk dicts, in order, into Anthropic stream events.

    Invariant: blocks are numbered 0, 1, 2, ... and at most one is open; a delta of another
    kind (thinking, text, or a different tool call) closes the open block first. Only choice
    0 is translated; token ids and logprobs are left to the recorder.
    """

    def __init__(self, *, model: str, context_management: AppliedEdits | None = None) -> None:
        self._model = model
        self._context_management = context_management
        self._started = False
        self._done = False
        self._blocks = 0  # blocks opened so far; an open block has index _blocks - 1
        self._open: str | None = None  # kind of the open block
        self._open_call: int | None = None  # chat tool-call index of the open tool_use block
        self._calls: set[int] = set()
        self._finish_reason: Any = None
        self._matched: Any = None
        self._usage: ChatUsage = {}

    def feed(self, chunk: ChatChunk) -> list[Event]:
        if self._done:
            raise RuntimeError("MessagesStream.feed after the stream ended")
        events = [] if self._started else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]  # cumulative, so the last one wins
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                events += self._choice(choice)
        return events

    def finish(self) -> list[Event]:
        """The closing events; safe when no finish reason or usage arrived."""
        if self._done:
            return []
        events = [] if self._started else self._start({})
        if self._blocks == 0:  # as in chat_to_message: one empty text block, never none
            events += self._open_block("text", {"type": "text", "text": ""})
        events += self._close()
        reason, sequence = _stop_reason(
            self._finish_reason, self._matched, tool_used=bool(self._calls)
        )
        usage: MessageUsage = {"output_tokens": _count(self._usage, "completion_tokens")}
        if "prompt_tokens" in self._usage:  # corrects message_start when ids were missing
            usage["input_tokens"] = _count(self._usage, "prompt_tokens")
        self._done = True
        delta: MessageDelta = {"stop_reason": reason, "stop_sequence": sequence}
        extra = {"context_management": self._context_management} if self._context_management else {}
        closing = _event("message_delta", delta=delta, usage=usage, **extra)
        return [*events, closing, _event("message_stop")]

    def error(self, message: str) -> list[Event]:
        """The event for a stream that broke off; nothing follows it."""
        self._done = True
        return [("error", error_body(message, "api_error"))]

    def _start(self, chunk: ChatChunk) -> list[Event]:
        self._started = True
        prompt = chunk.get("prompt_token_ids")
        message: Message = {
            "id": _message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": len(prompt) if isinstance(prompt, list) else 0,
                "output_tokens": 0,
            },
        }
        return [_event("message_start", message=message), _event("ping")]

    def _choice(self, choice: ChunkChoice) -> list[Event]:
        delta = choice.get("delta") or {}
        events: list[Event] = []
        reasoning = _reasoning(delta)
        if reasoning:
            events += self._append("thinking", {"type": "thinking_delta", "thinking": reasoning})
        if isinstance(delta.get("content"), str) and delta["content"]:
            events += self._append("text", {"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            events += self._tool_call(call)
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
            self._matched = choice.get("stop_reason")
        return events

    def _append(self, kind: str, delta: BlockDelta) -> list[Event]:
        """A thinking or text delta, opening a block of that kind first if needed."""
        events: list[Event] = []
        if self._open != kind:
            empty = {"thinking": "", "signature": ""} if kind == "thinking" else {"text": ""}
            events = self._close() + self._open_block(kind, {"type": kind, **empty})
        return [*events, self._delta(delta)]

    def _tool_call(self, call: ToolCallDelta) -> list[Event]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        events: list[Event] = []
        if not (self._open == "tool_use" and self._open_call == index):
            if index in self._calls:
                # vLLM streams calls one after another; a closed block cannot be reopened.
                raise RuntimeError(f"tool call {index} continued after its block was closed")
            block: ToolUseBlock = {
                "type": "tool_use",
                "id": call.get("id") or _tool_id(),
                "name": function.get("name") or "",
                "input": {},
            }
            events = self._close() + self._open_block("tool_use", block)
            self._calls.add(index)
            self._open_call = index
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _open_block(self, kind: str, block: ContentBlock) -> list[Event]:
        event = _event("content_block_start", index=self._blocks, content_block=block)
        self._blocks += 1
        self._open = kind
        return [event]

    def _delta(self, delta: BlockDelta) -> Event:
        return _event("content_block_delta", index=self._blocks - 1, delta=delta)

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        self._open_call = None
        return [_event("content_block_stop", index=self._blocks - 1)]
