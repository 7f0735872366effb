"""The OpenAI Responses API on top of vLLM chat completions.

Pure functions over parsed JSON, no I/O. A Responses request becomes one chat completions
request, so the proxy captures its token ids exactly as for a chat client; the chat answer,
whole or streamed, becomes a Response object or the Responses event sequence.

Invariant: output items turn back into chat messages through the same function as input
items, so a follow-up (through `previous_response_id` or by re-sending the output) shows the
model the messages a chat client would have sent.

Decisions:
- Reasoning items are re-sent as the `reasoning` field of the assistant message they precede
  (as vLLM's own Responses server does); the chat template decides whether to render it, so
  a tool loop's next prompt can extend the previous prompt plus completion token for token.
- We never encrypt reasoning: `include: ["reasoning.encrypted_content"]` is accepted and
  reasoning comes back as plain `content`, which round-trips the same way.
- Developer messages become system messages: open models' chat templates know no developer
  role and would drop them (the model would never see a harness's instructions).
- A `namespace` tool's functions become plain functions named `<namespace>__<name>` (the
  flat name Codex itself uses); calls to them come back split into `namespace` and `name`.
- Everything else follows the compatibility policy (proxy/base/compat_policy.py): soft hints
  and vendor-side fields are accepted and recorded, tools the model cannot be given are
  left out (or refused with `hosted_tools="refuse"`), and what would change the answer
  and cannot be honoured is refused with a 400 naming it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any, NotRequired, Required, TypeAlias, TypedDict

from proxy.api.translate.extras import VLLM_EXTRAS, vllm_extras
from proxy.api.translate.shapes import (
    ChatChoice,
    ChatChunk,
    ChatCompletion,
    ChatDelta,
    ChatFunction,
    ChatMessage,
    ChatRequest,
    ChatTextPart,
    ChatTokenLogprob,
    ChatTool,
    ChatToolCall,
    ChatUsage,
    ChunkChoice,
    ResponseFormat,
    ToolCallDelta,
)
from proxy.base.capture import REASONING_KEYS
from proxy.base.compat_policy import Compat, unmapped_fields
from store.json_types import JsonObject, JsonValue

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Request fields we cannot reproduce with one chat completion, and the feature they name.
_REFUSED_FIELDS = {
    "background": "background responses",
    "conversation": "conversations (use previous_response_id)",
    "prompt": "prompt templates",
    "moderation": "moderation",
}
_SAME_NAME = ("model", "temperature", "top_p", "parallel_tool_calls")
# vLLM's sampling extensions mean the same in both APIs.
_VLLM_EXTRAS = ("top_k", "stop", *VLLM_EXTRAS)
_MAPPED_FIELDS = frozenset(
    {
        *_SAME_NAME,
        *_VLLM_EXTRAS,
        *_REFUSED_FIELDS,
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "text",
        "stream",
        "include",
        "previous_response_id",
        "store",
        "reasoning",
        "top_logprobs",
        "user",
        "safety_identifier",
    }
)
# Accepted, recorded, not forwarded: they steer OpenAI's own servers (caching, capacity,
# attribution, server-side truncation and compaction, limits on its hosted tools, stream
# obfuscation), none changes what the served model samples.
_VENDOR_FIELDS = frozenset(
    {
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "service_tier",
        "client_metadata",
        "truncation",
        "context_management",
        "max_tool_calls",
        "stream_options",
    }
)
# `include` entries that ask for data of OpenAI-run tools (left out here) or for encrypted
# reasoning (we send reasoning in the clear): nothing to add.
_VENDOR_INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
    }
)
_ROLES = {"user", "assistant", "system", "developer"}
# content part type -> the key holding its text
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
NAMESPACE_DELIMITER = "__"


# ---------------------------------------------------------------- the answer's shapes
# What this module builds; a request (and each of its items) stays JsonObject: open keys.


class TokenLogprob(TypedDict):
    token: str
    bytes: list[int]
    logprob: float


class OutputLogprob(TokenLogprob):
    top_logprobs: list[TokenLogprob]


class OutputTextPart(TypedDict):
    type: str  # "output_text"
    text: str
    annotations: list[JsonObject]  # always empty: no citations
    logprobs: list[OutputLogprob]


class ReasoningTextPart(TypedDict):
    type: str  # "reasoning_text"
    text: str


class ReasoningItem(TypedDict):
    id: str
    type: str  # "reasoning"
    summary: list[JsonObject]  # always empty: the reasoning itself is in content
    content: list[ReasoningTextPart]
    status: str


class MessageItem(TypedDict):
    id: str
    type: str  # "message"
    status: str
    role: str  # "assistant"
    content: list[OutputTextPart]


class FunctionCallItem(TypedDict):
    id: str
    type: str  # "function_call"
    status: str
    arguments: str  # JSON text, as the model wrote it
    call_id: str
    name: str
    namespace: NotRequired[str]  # a namespace tool's function (`flat_tool_name`)


OutputItem: TypeAlias = ReasoningItem | MessageItem | FunctionCallItem


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(TypedDict):
    code: str
    message: str


class IncompleteDetails(TypedDict):
    reason: str


class Response(TypedDict):
    """A Response object: our outcome, plus the request's settings echoed as the client
    gave them (JsonValue: they are not ours to check)."""

    id: str
    object: str  # "response"
    created_at: int
    status: str  # in_progress | completed | incomplete | failed
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: JsonValue
    max_output_tokens: JsonValue
    max_tool_calls: JsonValue
    model: JsonValue
    output: list[OutputItem]
    parallel_tool_calls: JsonValue
    previous_response_id: JsonValue
    prompt_cache_key: JsonValue
    reasoning: JsonValue
    safety_identifier: JsonValue
    service_tier: str
    store: bool
    temperature: JsonValue
    text: JsonValue
    tool_choice: JsonValue
    tools: JsonValue
    top_logprobs: JsonValue
    top_p: JsonValue
    truncation: JsonValue
    usage: ResponseUsage | None
    user: JsonValue
    metadata: JsonValue


class EventPlace(TypedDict, total=False):
    """Where in the output an event's delta or part belongs."""

    item_id: str
    output_index: int
    content_index: int


class ResponsesEvent(EventPlace, total=False):
    """A streaming event; which keys it has besides its type and number depends on the type."""

    type: Required[str]
    sequence_number: Required[int]
    response: Response  # response.created, .in_progress, .completed, .incomplete, .failed
    item: OutputItem  # response.output_item.added, .done
    part: OutputTextPart | ReasoningTextPart  # response.content_part.added, .done
    delta: str  # the .delta events
    text: str  # response.output_text.done, response.reasoning_text.done
    logprobs: list[OutputLogprob]  # response.output_text.delta, .done
    name: str  # response.function_call_arguments.done
    arguments: str  # response.function_call_arguments.done
    code: str  # error
    message: str  # error
    param: None  # error


class TranslationError(Exception):
    """Client error: becomes a 400 in OpenAI's error shape."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


def new_response_id() -> str:
    return "resp_" + os.urandom(16).hex()


# ---------------------------------------------------------------- request: Responses -> chat


def responses_to_chat(
    body: JsonObject,
    *,
    history: list[ChatMessage] | None = None,
    compat: Compat | None = None,
    hosted_tools: str = "omit",
) -> ChatRequest:
    """The chat completions body for a Responses request.

    `history` is the stored conversation of `previous_response_id` (see `conversation_after`);
    it goes between this request's instructions and its input. `compat` collects what the
    compatibility policy did; `hosted_tools` is `omit` or `refuse`.
    """
    compat = compat if compat is not None else Compat()
    _refuse_unsupported(body)
    unmapped_fields(body, handled=_MAPPED_FIELDS, vendor_only=_VENDOR_FIELDS, compat=compat)
    chat: ChatRequest = {key: body[key] for key in _SAME_NAME if body.get(key) is not None}
    chat["messages"] = _chat_messages(body, history, compat)
    chat.update(_tool_fields(body, compat, hosted_tools))
    chat.update(_generation_fields(body, compat))
    chat.update(vllm_extras(body, _VLLM_EXTRAS))
    return chat


def _refuse_unsupported(body: JsonObject) -> None:
    for field, feature in _REFUSED_FIELDS.items():
        if body.get(field):
            raise TranslationError(f"this server does not support {feature}", param=field)
    include = body.get("include") or []
    if not isinstance(include, list):
        raise TranslationError("include must be a list", param="include")


def _chat_messages(
    body: JsonObject, history: list[ChatMessage] | None, compat: Compat
) -> list[ChatMessage]:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise TranslationError("instructions must be a string", param="instructions")
    new = _input_messages(body.get("input"), compat)
    if not new and not history:
        raise TranslationError("input is required", param="input")
    head: list[ChatMessage] = [{"role": "system", "content": instructions}] if instructions else []
    return [*head, *(history or []), *new]


def _input_messages(value: Any, compat: Compat) -> list[ChatMessage]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return items_to_messages(value, compat=compat)
    raise TranslationError("input must be a string or a list of items", param="input")


def items_to_messages(
    items: list[Any], *, where: str = "input", compat: Compat | None = None
) -> list[ChatMessage]:
    """Responses input (or output) items as chat messages.

    Consecutive assistant-side items (reasoning, an assistant message, function calls) fold
    into one assistant message, the shape a chat model produced them in.
    """
    compat = compat if compat is not None else Compat()
    messages: list[ChatMessage] = []
    for index, item in enumerate(items):
        place = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise TranslationError("input items must be objects", param=place)
        kind = item.get("type", "message" if "role" in item else None)
        handler = _ITEM_HANDLERS.get(kind)
        if handler is None:
            raise TranslationError(f"input items of type {kind!r} are not supported", param=place)
        handler(messages, item, place, compat)
    return messages


def _add_message(messages: list[ChatMessage], item: JsonObject, place: str, compat: Compat) -> None:
    role = item.get("role")
    if role not in _ROLES:
        raise TranslationError(f"message role {role!r} is not supported", param=f"{place}.role")
    content = _text_content(item.get("content"), f"{place}.content")
    if role == "assistant":
        _assistant_to_extend(messages, _is_bare)["content"] = content
        return
    if role == "developer":
        compat.note("honoured", "input.developer")
        role = "system"
    messages.append({"role": role, "content": content})


def _add_function_call(
    messages: list[ChatMessage], item: JsonObject, place: str, compat: Compat
) -> None:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise TranslationError("a function_call needs call_id, name and arguments", param=place)
    namespace = item.get("namespace")
    if namespace is not None:
        if not isinstance(namespace, str):
            raise TranslationError("a function_call's namespace must be a string", param=place)
        name = flat_tool_name(namespace, name)
    call: ChatToolCall = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    # parallel calls of one turn belong to one assistant message
    _assistant_to_extend(messages, lambda _: True).setdefault("tool_calls", []).append(call)


def _add_function_output(
    messages: list[ChatMessage], item: JsonObject, place: str, compat: Compat
) -> None:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str):
        raise TranslationError("a function_call_output needs call_id", param=place)
    content = _text_content(output, f"{place}.output")
    messages.append({"role": "tool", "tool_call_id": call_id, "content": content})


def _add_reasoning(
    messages: list[ChatMessage], item: JsonObject, place: str, compat: Compat
) -> None:
    text = _reasoning_text(item, place)
    if text:
        target = _assistant_to_extend(messages, _is_bare)
        target["reasoning"] = (target.get("reasoning") or "") + text


_Handler = Callable[[list[ChatMessage], JsonObject, str, Compat], None]
_ITEM_HANDLERS: dict[Any, _Handler] = {
    "message": _add_message,
    "function_call": _add_function_call,
    "function_call_output": _add_function_output,
    "reasoning": _add_reasoning,
}


def _is_bare(message: ChatMessage) -> bool:
    """An assistant message that so far holds at most reasoning."""
    return message.get("content") is None and not message.get("tool_calls")


def _assistant_to_extend(
    messages: list[ChatMessage], can_extend: Callable[[ChatMessage], bool]
) -> ChatMessage:
    """The trailing assistant message if `can_extend` accepts it, else a new one."""
    if messages and messages[-1].get("role") == "assistant" and can_extend(messages[-1]):
        return messages[-1]
    message: ChatMessage = {"role": "assistant", "content": None}
    messages.append(message)
    return message


def _text_content(content: Any, place: str) -> str | list[ChatTextPart]:
    """Text as chat content: one part collapses to a string; several stay text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TranslationError("content must be a string or a list of parts", param=place)
    texts = [_part_text(part, f"{place}[{index}]") for index, part in enumerate(content)]
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": text} for text in texts]


def _part_text(part: Any, place: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    key = _TEXT_PARTS.get(kind)
    if key is None:
        raise TranslationError(
            f"content parts of type {kind!r} are not supported (text only)", param=place
        )
    text = part.get(key)
    if not isinstance(text, str):
        raise TranslationError(f"a {kind} part needs a string {key!r}", param=place)
    return text


def _reasoning_text(item: JsonObject, place: str) -> str:
    # vLLM reads `content` and falls back to the summary; we do the same
    for key in ("content", "summary"):
        texts = [part.get("text") or "" for part in item.get(key) or [] if isinstance(part, dict)]
        if any(texts):
            return "".join(texts)
    if item.get("encrypted_content"):
        raise TranslationError("encrypted reasoning cannot be read by this server", param=place)
    return ""


# ---------------------------------------------------------------- request: tools


def flat_tool_name(namespace: str, name: str) -> str:
    """A namespaced function's name as the model sees it (Codex's own flat form)."""
    return f"{namespace.rstrip('_')}{NAMESPACE_DELIMITER}{name.lstrip('_')}"


def namespaced_tools(tools: Any) -> dict[str, tuple[str, str]]:
    """flat name -> (namespace, name) for the functions of the request's namespace tools."""
    found: dict[str, tuple[str, str]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            namespace = tool.get("name")
            for inner in tool.get("tools") or []:
                name = inner.get("name") if isinstance(inner, dict) else None
                if isinstance(namespace, str) and isinstance(name, str):
                    found[flat_tool_name(namespace, name)] = (namespace, name)
    return found


def _tool_fields(body: JsonObject, compat: Compat, hosted_tools: str) -> ChatRequest:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise TranslationError("tools must be a list", param="tools")
    chat_tools: list[ChatTool] = []
    for index, tool in enumerate(tools):
        chat_tools += _chat_tools(tool, f"tools[{index}]", compat, hosted_tools)
    names = [tool["function"]["name"] for tool in chat_tools]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise TranslationError(f"two tools are both named {name!r}", param="tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        chat_tools, choice = _allowed_tools(chat_tools, choice, hosted_tools)
    fields: ChatRequest = {"tools": chat_tools} if chat_tools else {}
    if choice is not None:
        fields.update(_chat_tool_choice(choice, {t["function"]["name"] for t in chat_tools}))
    return fields


def _chat_tools(tool: Any, place: str, compat: Compat, hosted_tools: str) -> list[ChatTool]:
    """The chat functions for one Responses tool: one, a namespace's several, or none."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "function":
        return [_chat_function(tool, place, tool.get("name"))]
    if kind == "namespace":
        return _namespace_functions(tool, place, compat, hosted_tools)
    # run by OpenAI (web search, file search, code interpreter, MCP, ...) or defined by
    # it without a schema here (local_shell, computer use): the model cannot be given it
    if hosted_tools == "refuse" or not isinstance(kind, str):
        raise TranslationError(
            f"tools of type {kind!r} are not supported; only function tools are", param=place
        )
    compat.note("left_out", kind)
    return []


def _chat_function(tool: JsonObject, place: str, name: Any) -> ChatTool:
    if not isinstance(name, str):
        raise TranslationError("a function tool needs a name", param=f"{place}.name")
    function: ChatFunction = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _namespace_functions(
    tool: JsonObject, place: str, compat: Compat, hosted_tools: str
) -> list[ChatTool]:
    namespace, inner = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not namespace:
        raise TranslationError("a namespace tool needs a name", param=f"{place}.name")
    if not isinstance(inner, list):
        raise TranslationError("a namespace tool needs a list of tools", param=f"{place}.tools")
    functions: list[ChatTool] = []
    for index, member in enumerate(inner):
        where = f"{place}.tools[{index}]"
        for function in _chat_tools(member, where, compat, hosted_tools):
            name = function["function"]["name"]
            function["function"]["name"] = flat_tool_name(namespace, name)
            functions.append(function)
    compat.note("flattened", namespace)
    return functions


def _allowed_tools(
    chat_tools: list[ChatTool], choice: JsonObject, hosted_tools: str
) -> tuple[list[ChatTool], Any]:
    """`allowed_tools` narrows the tool list; its mode is the chat tool_choice."""
    allowed = set()
    for index, tool in enumerate(choice.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            if hosted_tools == "omit" and isinstance(kind, str):
                continue  # a tool left out of the list cannot be allowed either
            raise TranslationError(
                "allowed_tools may only name function tools", param=f"tool_choice.tools[{index}]"
            )
        name, namespace = tool.get("name"), tool.get("namespace")
        allowed.add(flat_tool_name(namespace, name) if isinstance(namespace, str) else name)
    kept = [tool for tool in chat_tools if tool["function"]["name"] in allowed]
    return kept, choice.get("mode", "auto")


def _chat_tool_choice(choice: Any, names: set[str]) -> ChatRequest:
    if choice in ("auto", "none") and not names:
        return {}  # meaningless without tools, and vLLM refuses a choice without tools
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise TranslationError("tool_choice 'required' needs tools", param="tool_choice")
        return {"tool_choice": choice}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind != "function":
        raise TranslationError(f"tool_choice {kind!r} is not supported", param="tool_choice")
    name, namespace = choice.get("name"), choice.get("namespace")
    if isinstance(namespace, str) and isinstance(name, str):
        name = flat_tool_name(namespace, name)
    if name not in names:
        raise TranslationError(f"tool_choice names unknown function {name!r}", param="tool_choice")
    return {"tool_choice": {"type": "function", "function": {"name": name}}}


# ---------------------------------------------------------------- request: generation


def _generation_fields(body: JsonObject, compat: Compat) -> ChatRequest:
    fields: ChatRequest = {}
    if body.get("max_output_tokens") is not None:
        fields["max_tokens"] = body["max_output_tokens"]
    user = body.get("user") or body.get("safety_identifier")
    if user:
        fields["user"] = user
    fields.update(_reasoning_fields(body.get("reasoning"), compat))
    response_format = _response_format(body.get("text"), compat)
    if response_format is not None:
        fields["response_format"] = response_format
    include = body.get("include") or []
    for entry in include:
        if entry != LOGPROBS_INCLUDE:
            kind = "ignored" if entry in _VENDOR_INCLUDES else "unknown"
            compat.note(kind, f"include.{entry}")
    if LOGPROBS_INCLUDE in include:
        fields["logprobs"] = True
        if body.get("top_logprobs") is not None:
            fields["top_logprobs"] = body["top_logprobs"]
    if body.get("stream"):
        fields["stream"] = True
    return fields


def _reasoning_fields(reasoning: Any, compat: Compat) -> ChatRequest:
    if reasoning is None:
        return {}
    if not isinstance(reasoning, dict):
        raise TranslationError("reasoning must be an object", param="reasoning")
    # summaries: vLLM returns the reasoning itself, never a summary of it
    unmapped_fields(
        reasoning,
        handled=frozenset({"effort"}),
        vendor_only=frozenset({"summary", "generate_summary"}),
        compat=compat,
        where="reasoning",
    )
    effort = reasoning.get("effort")
    if effort is None:
        return {}
    compat.note("honoured", "reasoning.effort")
    return {"reasoning_effort": effort}


def _response_format(text: Any, compat: Compat) -> ResponseFormat | None:
    if text is None:
        return None
    if isinstance(text, dict):
        unmapped_fields(
            text,
            handled=frozenset({"format"}),
            vendor_only=frozenset({"verbosity"}),
            compat=compat,
            where="text",
        )
    fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise TranslationError(f"text.format {kind!r} is not supported", param="text.format")
    if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
        raise TranslationError("a json_schema format needs name and schema", param="text.format")
    schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
    return {"type": "json_schema", "json_schema": schema}


# ---------------------------------------------------------------- response: chat -> Responses


def chat_to_response(
    chat: ChatCompletion, *, request: JsonObject, response_id: str, created_at: int
) -> Response:
    """The Response object for a whole chat completion (its first choice)."""
    choices = chat.get("choices") or [{}]
    choice, message = choices[0], choices[0].get("message") or {}
    logprobs = _content_logprobs(choice, message) if _wants_logprobs(request) else []
    namespaces = namespaced_tools(request.get("tools"))
    output = _output_items(message, logprobs, response_id, namespaces)
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    if status == "incomplete" and output:
        output[-1]["status"] = "incomplete"
    return _response(
        request,
        response_id=response_id,
        created_at=created_at,
        model=chat.get("model") or request.get("model"),
        status=status,
        output=output,
        usage=_usage(chat.get("usage")),
    )


def _output_items(
    message: ChatMessage,
    logprobs: list[OutputLogprob],
    response_id: str,
    namespaces: dict[str, tuple[str, str]],
) -> list[OutputItem]:
    items: list[OutputItem] = []
    reasoning = _reasoning_of(message)
    if reasoning:
        item = _reasoning_item(_item_id("rs", response_id, len(items)), "completed")
        item["content"].append({"type": "reasoning_text", "text": reasoning})
        items.append(item)
    content = message.get("content")
    if isinstance(content, str) and content:
        item = _message_item(_item_id("msg", response_id, len(items)), "completed")
        item["content"].append(_text_part(content, logprobs))
        items.append(item)
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        item = _call_item(response_id, len(items), call.get("id"))
        _name_call(item, function.get("name"), namespaces)
        item.update(status="completed", arguments=function.get("arguments") or "")
        items.append(item)
    return items


def _item_id(prefix: str, response_id: str, output_index: int) -> str:
    """Ids derived from the response id, so a stream and its final Response agree."""
    return f"{prefix}_{response_id.removeprefix('resp_')}_{output_index}"


def _reasoning_item(item_id: str, status: str) -> ReasoningItem:
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [], "status": status}


def _message_item(item_id: str, status: str) -> MessageItem:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": []}


def _text_part(text: str, logprobs: list[OutputLogprob]) -> OutputTextPart:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _call_item(response_id: str, output_index: int, call_id: str | None) -> FunctionCallItem:
    return {
        "id": _item_id("fc", response_id, output_index),
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": call_id or _item_id("call", response_id, output_index),
        "name": "",
    }


def _name_call(item: FunctionCallItem, name: Any, namespaces: dict[str, tuple[str, str]]) -> None:
    """A call's name as the client declared it: a flattened one goes back to its namespace."""
    if not isinstance(name, str) or not name:
        return
    if name in namespaces:
        item["namespace"], item["name"] = namespaces[name]
    else:
        item["name"] = name


def _reasoning_of(message: ChatMessage | ChatDelta) -> str:
    for key in REASONING_KEYS:
        if isinstance(message.get(key), str) and message[key]:
            return message[key]
    return ""


def _wants_logprobs(request: JsonObject) -> bool:
    return LOGPROBS_INCLUDE in (request.get("include") or [])


def _content_logprobs(choice: ChatChoice, message: ChatMessage) -> list[OutputLogprob]:
    """The logprobs of the visible text's tokens, in the Responses shape.

    vLLM reports every sampled token, reasoning and tool-call markup included; when there is
    such markup, the text's tokens are the last run that spells the text. Empty when the
    tokens cannot be matched (e.g. a character split across tokens).
    """
    entries = (choice.get("logprobs") or {}).get("content") or []
    content = message.get("content")
    if not isinstance(content, str) or not content:
        return []
    if not _reasoning_of(message) and not message.get("tool_calls"):
        return [_logprob(entry) for entry in entries]
    return [_logprob(entry) for entry in _spelling_run(entries, content.strip())]


def _spelling_run(entries: list[ChatTokenLogprob], target: str) -> list[ChatTokenLogprob]:
    # the text follows the reasoning, so search from the end
    for start in range(len(entries) - 1, -1, -1):
        spelled = ""
        for end in range(start, len(entries)):
            spelled += entries[end].get("token") or ""
            if spelled.strip() == target:
                return entries[start : end + 1]
            if not target.startswith(spelled.lstrip()):
                break
    return []


def _logprob(entry: ChatTokenLogprob) -> OutputLogprob:
    top = [_token_logprob(alt) for alt in entry.get("top_logprobs") or []]
    return {**_token_logprob(entry), "top_logprobs": top}


def _token_logprob(entry: ChatTokenLogprob) -> TokenLogprob:
    token = entry.get("token") or ""
    raw = entry.get("bytes")
    return {
        "token": token,
        "bytes": raw if raw is not None else list(token.encode()),
        "logprob": entry.get("logprob", 0.0),
    }


def _usage(usage: ChatUsage | None) -> ResponseUsage | None:
    if not usage:
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def _response(
    request: JsonObject,
    *,
    response_id: str,
    created_at: int,
    model: Any,
    status: str,
    output: list[OutputItem],
    usage: ResponseUsage | None = None,
    error: ResponseError | None = None,
) -> Response:
    """A Response object: our outcome plus the request settings it echoes."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    parallel = request.get("parallel_tool_calls")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": model or "",  # required by the SDK even when the client named none
        "output": output,
        "parallel_tool_calls": True if parallel is None else parallel,
        "previous_response_id": request.get("previous_response_id"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "reasoning": request.get("reasoning"),
        "safety_identifier": request.get("safety_identifier"),
        "service_tier": "default",
        "store": request.get("store") is not False,
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": request.get("tools") or [],
        "top_logprobs": request.get("top_logprobs"),
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation") or "disabled",
        "usage": usage,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


# ---------------------------------------------------------------- conversation state


def conversation_after(chat_request: ChatRequest, response: Response) -> list[ChatMessage]:
    """The chat messages a follow-up with `previous_response_id` continues from.

    The request's messages without its instructions (they are not inherited; system or
    developer messages the client sent as input items are), then the response's output.
    """
    messages = list(chat_request.get("messages") or [])
    instructions = response.get("instructions")
    if instructions and messages and messages[0] == {"role": "system", "content": instructions}:
        messages = messages[1:]
    return messages + items_to_messages(response.get("output") or [], where="output")


# ---------------------------------------------------------------- streaming


class ResponsesStream:
    """vLLM chat.completion.chunk dicts in, Responses streaming events out.

    `response.created` and `response.in_progress` open the first batch of events, whichever
    method returns it. A reasoning or text item closes when output of another kind starts;
    function-call items stay open until the end, so deltas of parallel calls may interleave.
    Item ids derive from the response id, as in `chat_to_response`.
    """

    def __init__(self, *, request: JsonObject, response_id: str, created_at: int) -> None:
        self._request = request
        self._response_id = response_id
        self._created_at = created_at
        self._model = request.get("model")
        self._logprobs = _wants_logprobs(request)
        self._namespaces = namespaced_tools(request.get("tools"))
        self._sequence = 0
        self._started = False
        self._items: list[OutputItem] = []
        # "reasoning", "text" or "call<index>" -> output index of the item still open
        self._open: dict[str, int] = {}
        self._usage: ResponseUsage | None = None
        self._finish_reason: str | None = None
        self._final: Response | None = None

    @property
    def response(self) -> Response:
        """The final Response once finished (or failed); until then, the one in progress."""
        return self._final if self._final is not None else self._snapshot("in_progress")

    def feed(self, chunk: ChatChunk) -> list[ResponsesEvent]:
        events = self._start()
        if chunk.get("model"):
            self._model = chunk["model"]
        if chunk.get("usage"):
            self._usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                events += self._choice(choice)
        return events

    def finish(self) -> list[ResponsesEvent]:
        if self._final is not None:
            return []
        events = self._start()
        status = "incomplete" if self._finish_reason == "length" else "completed"
        last = max(self._open.values(), default=None)
        for slot, index in sorted(self._open.items(), key=lambda entry: entry[1]):
            cut = status == "incomplete" and index == last
            events += self._close(slot, "incomplete" if cut else "completed")
        self._final = self._snapshot(status)
        events.append(self._event(f"response.{status}", response=self._final))
        return events

    def error(self, message: str) -> list[ResponsesEvent]:
        if self._final is not None:
            return []
        events = self._start()
        for index in self._open.values():
            self._items[index]["status"] = "incomplete"
        self._open.clear()
        events.append(self._event("error", code="server_error", message=message, param=None))
        failure: ResponseError = {"code": "server_error", "message": message}
        self._final = self._snapshot("failed", error=failure)
        events.append(self._event("response.failed", response=self._final))
        return events

    def _start(self) -> list[ResponsesEvent]:
        if self._started:
            return []
        self._started = True
        return [
            self._event("response.created", response=self._snapshot("in_progress")),
            self._event("response.in_progress", response=self._snapshot("in_progress")),
        ]

    def _choice(self, choice: ChunkChoice) -> list[ResponsesEvent]:
        delta = choice.get("delta") or {}
        events: list[ResponsesEvent] = []
        reasoning = _reasoning_of(delta)
        if reasoning:
            events += self._prose_delta("reasoning", reasoning, [])
        if isinstance(delta.get("content"), str) and delta["content"]:
            entries = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [_logprob(entry) for entry in entries] if self._logprobs else []
            events += self._prose_delta("text", delta["content"], logprobs)
        for call in delta.get("tool_calls") or []:
            events += self._call_delta(call)
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
        return events

    def _prose_delta(
        self, slot: str, text: str, logprobs: list[OutputLogprob]
    ) -> list[ResponsesEvent]:
        events = self._close_prose(but=slot)
        if slot not in self._open:
            events += self._open_prose(slot)
        index = self._open[slot]
        item = self._items[index]
        part = item["content"][0]
        part["text"] += text
        where: EventPlace = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if slot == "reasoning":
            events.append(self._event("response.reasoning_text.delta", **where, delta=text))
        else:
            part["logprobs"].extend(logprobs)
            events.append(
                self._event("response.output_text.delta", **where, delta=text, logprobs=logprobs)
            )
        return events

    def _open_prose(self, slot: str) -> list[ResponsesEvent]:
        index = len(self._items)
        item: ReasoningItem | MessageItem
        part: ReasoningTextPart | OutputTextPart
        if slot == "reasoning":
            item = _reasoning_item(_item_id("rs", self._response_id, index), "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = _message_item(_item_id("msg", self._response_id, index), "in_progress")
            part = _text_part("", [])
        self._items.append(item)
        self._open[slot] = index
        added = self._event("response.output_item.added", output_index=index, item=_copy(item))
        item["content"].append(part)
        where: EventPlace = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [added, self._event("response.content_part.added", **where, part=_copy(part))]

    def _call_delta(self, call: ToolCallDelta) -> list[ResponsesEvent]:
        events = self._close_prose(but=None)
        slot = f"call{call.get('index', 0)}"
        function = call.get("function") or {}
        if slot not in self._open:
            index = len(self._items)
            item = _call_item(self._response_id, index, call.get("id"))
            _name_call(item, function.get("name"), self._namespaces)
            self._items.append(item)
            self._open[slot] = index
            events.append(
                self._event("response.output_item.added", output_index=index, item=_copy(item))
            )
        index = self._open[slot]
        item = self._items[index]
        if not item["name"]:
            _name_call(item, function.get("name"), self._namespaces)
        if function.get("arguments"):
            item["arguments"] += function["arguments"]
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=function["arguments"],
                )
            )
        return events

    def _close_prose(self, *, but: str | None) -> list[ResponsesEvent]:
        events: list[ResponsesEvent] = []
        for slot in ("reasoning", "text"):
            if slot != but and slot in self._open:
                events += self._close(slot, "completed")
        return events

    def _close(self, slot: str, status: str) -> list[ResponsesEvent]:
        index = self._open.pop(slot)
        item = self._items[index]
        item["status"] = status
        where: EventPlace = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        else:
            events = self._close_part(item, where)
        events.append(
            self._event("response.output_item.done", output_index=index, item=_copy(item))
        )
        return events

    def _close_part(
        self, item: ReasoningItem | MessageItem, where: EventPlace
    ) -> list[ResponsesEvent]:
        part = item["content"][0]
        where = {**where, "content_index": 0}
        if item["type"] == "reasoning":
            done = self._event("response.reasoning_text.done", **where, text=part["text"])
        else:
            done = self._event(
                "response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"]
            )
        return [done, self._event("response.content_part.done", **where, part=_copy(part))]

    def _snapshot(self, status: str, error: ResponseError | None = None) -> Response:
        return _response(
            self._request,
            response_id=self._response_id,
            created_at=self._created_at,
            model=self._model,
            status=status,
            output=_copy(self._items),
            usage=self._usage,
            error=error,
        )

    def _event(self, type_: str, **fields: Any) -> ResponsesEvent:
        event: ResponsesEvent = {"type": type_, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def _copy(value: Any) -> Any:
    # events outlive the mutable item they describe
    return copy.deepcopy(value)
