"""Gemini API (`models/{model}:generateContent`) <-> chat completions, so Gemini clients
(Gemini CLI, the google-genai SDKs) ride vLLM's chat endpoint.

Pure functions over parsed JSON, no I/O. Invariant, as for Messages and Responses: every
part of a request is mapped onto the chat request, handled by the compatibility policy
(proxy/base/compat_policy.py, recorded in the `Compat` passed in) or refused with a
`TranslationError` that names it. Google's JSON takes field names in lowerCamelCase or
snake_case alike; both are read here.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Required, TypeAlias, TypedDict

from proxy.api.translate.extras import VLLM_EXTRAS, vllm_extras
from proxy.api.translate.messages import TranslationError
from proxy.api.translate.shapes import (
    ChatChunk,
    ChatCompletion,
    ChatContentPart,
    ChatDelta,
    ChatFunction,
    ChatFunctionCall,
    ChatImagePart,
    ChatMessage,
    ChatRequest,
    ChatTool,
    ChatToolCall,
    ChatUsage,
    ToolCallDelta,
)
from proxy.base.capture import REASONING_KEYS
from proxy.base.compat_policy import Compat, unmapped_fields
from store.json_types import JsonObject

# request fields, as lowerCamelCase
_MAPPED_FIELDS = frozenset(
    {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "model"}
)
# steer Google's servers (safety filters, cached prompts, billing labels, routing): they
# cannot change the tokens a self-hosted model samples
_VENDOR_FIELDS = frozenset({"safetySettings", "cachedContent", "labels", "serviceTier", "store"})
_GENERATION_MAPPED = frozenset(
    {
        "temperature",
        "topP",
        "topK",
        "maxOutputTokens",
        "stopSequences",
        "candidateCount",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "thinkingConfig",
        "responseModalities",
    }
)
# how Google's servers render or bill the answer, or what they add to it; not the tokens
_GENERATION_VENDOR = frozenset(
    {
        "responseLogprobs",  # vLLM's logprobs are recorded by the proxy; not returned here
        "logprobs",
        "mediaResolution",
        "speechConfig",
        "enableEnhancedCivicAnswers",
        "audioTimestamp",
        "routingConfig",
        "modelSelectionConfig",
    }
)
_PART_DATA = ("text", "functionCall", "functionResponse", "inlineData")
_PART_VENDOR = frozenset({"thoughtSignature", "partMetadata", "videoMetadata", "mediaResolution"})
_CALLING_MODES = {"AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}
_FINISH = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_SNAKE = re.compile(r"_([a-z0-9])")


# --- the answer's shapes (what this module builds; a request stays JsonObject: open keys) ---


class ErrorDetail(TypedDict):
    code: int  # the HTTP status
    message: str
    status: str  # Google's name for it (STATUS)


class ErrorBody(TypedDict):
    """Google's error shape: an error response's body, a broken stream's last chunk."""

    error: ErrorDetail


class FunctionCall(TypedDict, total=False):
    name: Required[str]
    args: Required[JsonObject]
    id: str  # the chat call's id, when it had one


class Part(TypedDict, total=False):
    """An answer's part: text (a thought when `thought`), or one function call."""

    text: str
    thought: bool
    functionCall: FunctionCall


class Content(TypedDict):
    role: str  # "model"
    parts: list[Part]


class Candidate(TypedDict, total=False):
    content: Required[Content]
    index: Required[int]
    finishReason: str


class UsageMetadata(TypedDict):
    promptTokenCount: int
    candidatesTokenCount: int
    totalTokenCount: int


class GenerateContentResponse(TypedDict, total=False):
    """A whole answer, or one chunk of a stream."""

    candidates: Required[list[Candidate]]
    modelVersion: Required[str]
    usageMetadata: UsageMetadata  # the whole answer and a stream's last chunk
    responseId: Required[str]


# what a stream sends: answer chunks, or an error if it broke off
StreamChunk: TypeAlias = GenerateContentResponse | ErrorBody


class StreamedCall(TypedDict):
    """A tool call being assembled from a stream's deltas."""

    id: str | None
    function: ChatFunctionCall


def error_body(status: int, message: str) -> ErrorBody:
    """Google's error shape: {"error": {"code", "message", "status"}}."""
    return {"error": {"code": status, "message": message, "status": STATUS.get(status, "UNKNOWN")}}


def camel(name: str) -> str:
    return _SNAKE.sub(lambda m: m.group(1).upper(), name)


def _fields(obj: JsonObject) -> JsonObject:
    """An object's fields under their lowerCamelCase names (snake_case is the same field)."""
    return {camel(k): v for k, v in obj.items()}


def _object(value: Any, where: str) -> JsonObject:
    if not isinstance(value, dict):
        raise TranslationError(f"{where}: expected an object", param=where)
    return _fields(value)


# --- request ------------------------------------------------------------------------------


def gemini_to_chat(
    body: JsonObject, *, model: str, compat: Compat, hosted_tools: str = "omit"
) -> ChatRequest:
    """The chat request for a generateContent request to `model` (from the URL)."""
    if not isinstance(body, dict):
        raise TranslationError("the request body must be a JSON object")
    body = _fields(body)
    unmapped_fields(body, handled=_MAPPED_FIELDS, vendor_only=_VENDOR_FIELDS, compat=compat)
    messages = _system(body.get("systemInstruction")) + _contents(body.get("contents"), compat)
    chat: ChatRequest = {"model": model, "messages": messages}
    tools = _tools(body.get("tools"), compat, hosted_tools)
    if tools:
        chat["tools"] = tools
    _tool_config(body.get("toolConfig"), chat, compat)
    config = body.get("generationConfig")
    if config is not None:
        _generation(_object(config, "generationConfig"), chat, compat)
    return chat


def count_tokens_chat_body(body: JsonObject, *, model: str) -> ChatRequest:
    """countTokens takes `contents` alone, or a whole `generateContentRequest`."""
    if not isinstance(body, dict):
        raise TranslationError("the request body must be a JSON object")
    fields = _fields(body)
    inner = fields.get("generateContentRequest")
    request = _object(inner, "generateContentRequest") if inner is not None else fields
    chat = gemini_to_chat(request, model=model, compat=Compat())
    chat["max_tokens"] = 1
    return chat


def _system(instruction: Any) -> list[ChatMessage]:
    if instruction is None:
        return []
    if isinstance(instruction, str):  # the SDKs accept a bare string
        return [{"role": "system", "content": instruction}]
    content = _object(instruction, "systemInstruction")
    texts = []
    for j, part in enumerate(content.get("parts") or []):
        at = f"systemInstruction.parts.{j}"
        text = _object(part, at).get("text")
        if not isinstance(text, str):
            raise TranslationError(f"{at}: only text parts are supported here", param=at)
        texts.append(text)
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _contents(contents: Any, compat: Compat) -> list[ChatMessage]:
    if not isinstance(contents, list) or not contents:
        raise TranslationError("contents: at least one content is required", param="contents")
    messages: list[ChatMessage] = []
    pending: list[tuple[str, str]] = []  # (name, call id) of the model's unanswered calls
    for i, raw in enumerate(contents):
        where = f"contents.{i}"
        content = _object(raw, where)
        role = content.get("role") or "user"
        parts = content.get("parts")
        if not isinstance(parts, list):
            raise TranslationError(f"{where}.parts: expected a list", param=f"{where}.parts")
        if role == "model":
            message, pending = _model_turn(parts, where, i, compat)
            messages.append(message)
        elif role in ("user", "function", "tool"):
            messages += _user_turn(parts, where, pending, compat)
        else:
            raise TranslationError(
                f"{where}.role: expected 'user' or 'model', got {role!r}", param=f"{where}.role"
            )
    return messages


def _parts(parts: list[Any], where: str, compat: Compat) -> list[tuple[str, str, Any]]:
    """(where, kind, value) per part; metadata of Google's own noted; other data refused."""
    out = []
    for j, raw in enumerate(parts):
        at = f"{where}.parts.{j}"
        part = _object(raw, at)
        kinds = [k for k in _PART_DATA if part.get(k) is not None]
        others = [k for k in part if k not in _PART_DATA and k != "thought" and part[k] is not None]
        data = [k for k in others if k not in _PART_VENDOR]
        if data or len(kinds) != 1:
            # conversation content is never dropped: a part we cannot show the model is a 400
            shown = ", ".join(data or kinds) or "nothing"
            raise TranslationError(
                f"{at}: a part must hold one of text, functionCall, functionResponse, "
                f"inlineData (image); it holds {shown}",
                param=at,
            )
        for key in others:
            compat.note("ignored", f"{where}.parts.{key}")
        kind = kinds[0]
        if kind == "text" and part.get("thought") is True:
            kind = "thought"
        out.append((at, kind, part[kinds[0]]))
    return out


def _model_turn(
    parts: list[Any], where: str, turn: int, compat: Compat
) -> tuple[ChatMessage, list[tuple[str, str]]]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ChatToolCall] = []
    for at, kind, value in _parts(parts, where, compat):
        if kind == "text":
            texts.append(_string(value, at))
        elif kind == "thought":
            thoughts.append(_string(value, at))
        elif kind == "functionCall":
            calls.append(_tool_call(_object(value, f"{at}.functionCall"), at, turn, len(calls)))
        else:
            raise TranslationError(
                f"{at}: a model turn holds text and functionCall parts", param=at
            )
    message: ChatMessage = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning"] = "".join(thoughts)
    return message, [(c["function"]["name"], c["id"]) for c in calls]


def _tool_call(call: JsonObject, where: str, turn: int, index: int) -> ChatToolCall:
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError(f"{where}.functionCall.name: field required", param=where)
    args = call.get("args") or {}
    if not isinstance(args, dict):
        raise TranslationError(f"{where}.functionCall.args: expected an object", param=where)
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{turn}_{index}"  # the same on every request of this conversation
    # ensure_ascii=False as vLLM's tool parsers serialise arguments (trajectory stitching)
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _user_turn(
    parts: list[Any], where: str, pending: list[tuple[str, str]], compat: Compat
) -> list[ChatMessage]:
    """Function responses first (as tool messages, answering the model's calls), then what
    the user says (text and images) as one user message."""
    tools: list[ChatMessage] = []
    content: list[ChatContentPart] = []
    waiting = list(pending)
    for at, kind, value in _parts(parts, where, compat):
        if kind in ("text", "thought"):
            content.append({"type": "text", "text": _string(value, at)})
        elif kind == "inlineData":
            content.append(_image(_object(value, f"{at}.inlineData"), at))
        elif kind == "functionResponse":
            tools.append(_tool_message(_object(value, f"{at}.functionResponse"), at, waiting))
        else:
            raise TranslationError(
                f"{at}: a user turn holds text, inlineData and functionResponse parts", param=at
            )
    messages = tools
    if content:
        only_text = all(c["type"] == "text" for c in content)
        text = "".join(c["text"] for c in content) if only_text else content
        messages.append({"role": "user", "content": text})
    return messages


def _tool_message(response: JsonObject, where: str, waiting: list[tuple[str, str]]) -> ChatMessage:
    name = response.get("name")
    call_id = response.get("id")
    if not isinstance(call_id, str) or not call_id:
        # no id: the model's oldest unanswered call of that name
        match = next((w for w in waiting if w[0] == name), waiting[0] if waiting else None)
        if match is None:
            raise TranslationError(
                f"{where}.functionResponse: it answers no functionCall of the model's",
                param=where,
            )
        call_id = match[1]
    waiting[:] = [w for w in waiting if w[1] != call_id]
    result = response.get("response")
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _image(data: JsonObject, where: str) -> ChatImagePart:
    mime = data.get("mimeType")
    payload = data.get("data")
    if not (isinstance(mime, str) and mime.startswith("image/") and isinstance(payload, str)):
        raise TranslationError(
            f"{where}.inlineData: only images (image/*, base64 data) can be shown to the model",
            param=where,
        )
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{payload}"}}


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TranslationError(f"{where}: expected a string", param=where)
    return value


# --- request: tools -----------------------------------------------------------------------


def _tools(tools: Any, compat: Compat, hosted_tools: str) -> list[ChatTool]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise TranslationError("tools: expected a list", param="tools")
    out: list[ChatTool] = []
    for i, raw in enumerate(tools):
        tool = _object(raw, f"tools.{i}")
        for key, value in tool.items():
            if value is None:
                continue
            if key == "functionDeclarations":
                if not isinstance(value, list):
                    raise TranslationError(f"tools.{i}.{key}: expected a list", param="tools")
                out += [
                    _function(_object(f, f"tools.{i}.{key}.{j}"), f"tools.{i}.{key}.{j}", compat)
                    for j, f in enumerate(value)
                ]
            elif hosted_tools == "refuse":
                # Google Search, code execution, URL context, ...: run by Google's servers
                raise TranslationError(
                    f"tools.{i}.{key}: a tool Google's servers run is not supported by this "
                    "proxy; only functionDeclarations are",
                    param=f"tools.{i}.{key}",
                )
            else:
                compat.note("left_out", key)
    return out


def _function(declaration: JsonObject, where: str, compat: Compat) -> ChatTool:
    unmapped_fields(
        declaration,
        handled=frozenset({"name", "description", "parameters", "parametersJsonSchema"}),
        vendor_only=frozenset({"behavior"}),
        compat=compat,
        where="tools.functionDeclarations",
    )
    name = declaration.get("name")
    if not isinstance(name, str) or not name:
        raise TranslationError(f"{where}.name: field required", param=f"{where}.name")
    function: ChatFunction = {"name": name}
    if isinstance(declaration.get("description"), str):
        function["description"] = declaration["description"]
    schema = declaration.get("parametersJsonSchema")
    if schema is None and declaration.get("parameters") is not None:
        schema = json_schema(declaration["parameters"])  # Google's OpenAPI subset
    function["parameters"] = schema if isinstance(schema, dict) else {"type": "object"}
    return {"type": "function", "function": function}


def json_schema(schema: Any) -> Any:
    """Google's Schema (OpenAPI 3.0 subset, types in upper case) as JSON Schema."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: JsonObject = {}
    for key, value in schema.items():
        key = camel(key)
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = json_schema(value)
        elif key == "nullable":
            continue  # folded into the type below
        else:
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _tool_config(config: Any, chat: ChatRequest, compat: Compat) -> None:
    if config is None:
        return
    calling = _object(config, "toolConfig").get("functionCallingConfig")
    if calling is None:
        return
    calling = _object(calling, "toolConfig.functionCallingConfig")
    mode = str(calling.get("mode") or "AUTO").upper()
    if mode not in _CALLING_MODES:
        raise TranslationError(
            f"toolConfig.functionCallingConfig.mode: expected AUTO, ANY, NONE or VALIDATED, "
            f"got {calling.get('mode')!r}",
            param="toolConfig.functionCallingConfig.mode",
        )
    tools = chat.get("tools") or []
    if not tools:
        if mode == "ANY":
            raise TranslationError("toolConfig: mode ANY needs function declarations")
        return
    allowed = calling.get("allowedFunctionNames")
    if isinstance(allowed, list) and allowed and mode in ("ANY", "VALIDATED"):
        # the model may call only these: it is shown only these
        compat.note("honoured", "toolConfig.functionCallingConfig.allowedFunctionNames")
        chat["tools"] = [t for t in tools if t["function"]["name"] in allowed]
        if not chat["tools"]:
            raise TranslationError(
                "toolConfig.functionCallingConfig.allowedFunctionNames: none is declared",
                param="toolConfig.functionCallingConfig.allowedFunctionNames",
            )
    if mode == "ANY" and len(chat["tools"]) == 1:
        chat["tool_choice"] = {
            "type": "function",
            "function": {"name": chat["tools"][0]["function"]["name"]},
        }
    else:
        chat["tool_choice"] = _CALLING_MODES[mode]


# --- request: generationConfig ------------------------------------------------------------


def _generation(config: JsonObject, chat: ChatRequest, compat: Compat) -> None:
    unmapped_fields(
        config,
        handled=_GENERATION_MAPPED | {camel(key) for key in VLLM_EXTRAS},
        vendor_only=_GENERATION_VENDOR,
        compat=compat,
        where="generationConfig",
    )
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("max_tokens", "maxOutputTokens"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        value = config.get(theirs)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                where = f"generationConfig.{theirs}"
                raise TranslationError(f"{where}: expected a number", param=where)
            chat[ours] = int(value) if ours in ("top_k", "max_tokens", "seed") else value
    stops = config.get("stopSequences")
    if stops:
        chat["stop"] = [_string(s, "generationConfig.stopSequences") for s in stops]
    candidates = config.get("candidateCount")
    if candidates not in (None, 1):
        raise TranslationError(
            "generationConfig.candidateCount: this proxy answers with one candidate",
            param="generationConfig.candidateCount",
        )
    modalities = config.get("responseModalities")
    if modalities and any(str(m).upper() != "TEXT" for m in modalities):
        raise TranslationError(
            "generationConfig.responseModalities: the served model answers in TEXT only",
            param="generationConfig.responseModalities",
        )
    chat.update(_response_format(config, compat))
    # vLLM's own extensions, under their camelCase names by now (_fields)
    chat.update(vllm_extras(config, spelled=camel))
    thinking = config.get("thinkingConfig")
    if thinking is not None:
        thinking = _object(thinking, "generationConfig.thinkingConfig")
        budget = thinking.get("thinkingBudget")
        level = thinking.get("thinkingLevel")
        # the chat template's reasoning switch (templates without one ignore it); a budget
        # or level beyond on/off is vLLM's reasoning config, which the proxy cannot see
        compat.note("honoured", "generationConfig.thinkingConfig")
        off = budget == 0 or (isinstance(level, str) and level.upper() == "MINIMAL")
        chat["chat_template_kwargs"] = {"enable_thinking": not off}


def _response_format(config: JsonObject, compat: Compat) -> ChatRequest:
    mime = config.get("responseMimeType")
    schema = config.get("responseJsonSchema")
    if schema is None and config.get("responseSchema") is not None:
        schema = json_schema(config["responseSchema"])
    if mime in (None, "text/plain") and schema is None:
        return {}
    if mime not in (None, "application/json"):
        raise TranslationError(
            f"generationConfig.responseMimeType: {mime!r} is not supported "
            "(text/plain or application/json)",
            param="generationConfig.responseMimeType",
        )
    compat.note("honoured", "generationConfig.responseMimeType")
    if schema is None:
        return {"response_format": {"type": "json_object"}}
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema},
        }
    }


def includes_thoughts(body: Any) -> bool:
    """generationConfig.thinkingConfig.includeThoughts: the answer carries thought parts."""
    if not isinstance(body, dict):
        return False
    config = _fields(body).get("generationConfig")
    thinking = _fields(config).get("thinkingConfig") if isinstance(config, dict) else None
    return isinstance(thinking, dict) and _fields(thinking).get("includeThoughts") is True


# --- response -----------------------------------------------------------------------------


def chat_to_gemini(chat: ChatCompletion, *, model: str, thoughts: bool) -> GenerateContentResponse:
    """The GenerateContentResponse for a whole chat completion (its choice 0)."""
    choices = [c for c in chat.get("choices") or [] if isinstance(c, dict)]
    if not choices:
        raise ValueError("the upstream chat completion has no choices")
    choice = next((c for c in choices if c.get("index", 0) == 0), choices[0])
    message = choice.get("message") or {}
    parts: list[Part] = []
    reasoning = _reasoning(message)
    if reasoning and thoughts:
        parts.append({"text": reasoning, "thought": True})
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append({"text": message["content"]})
    parts += [_function_call(call) for call in message.get("tool_calls") or []]
    return _response(
        parts or [{"text": ""}],
        finish=choice.get("finish_reason"),
        usage=chat.get("usage") or {},
        model=model,
        response_id=chat.get("id"),
    )


def _reasoning(container: ChatMessage | ChatDelta) -> str:
    return next((container[key] for key in REASONING_KEYS if container.get(key)), "")


def _function_call(call: ChatToolCall | StreamedCall) -> Part:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        args = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except json.JSONDecodeError:
        args = {}  # not an object: the client's tool refuses the call, and the model sees it
    if not isinstance(args, dict):
        args = {}
    found: FunctionCall = {"name": function.get("name") or "", "args": args}
    if call.get("id"):
        found["id"] = call["id"]
    return {"functionCall": found}


def _usage(usage: ChatUsage) -> UsageMetadata:
    prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else 0
    out = usage.get("completion_tokens")
    out = out if isinstance(out, int) else 0
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": out,
        "totalTokenCount": prompt + out,
    }


def _response(
    parts: list[Part],
    *,
    finish: Any,
    usage: ChatUsage | None,
    model: str,
    response_id: Any,
) -> GenerateContentResponse:
    candidate: Candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = _FINISH.get(str(finish), "OTHER")
    answer: GenerateContentResponse = {"candidates": [candidate], "modelVersion": model}
    if usage is not None:
        answer["usageMetadata"] = _usage(usage)
    answer["responseId"] = (
        response_id.removeprefix("chatcmpl-") if isinstance(response_id, str) else uuid.uuid4().hex
    )
    return answer


class GeminiStream:
    """vLLM chat.completion.chunk dicts, in order, as GenerateContentResponse chunks.

    Text and thoughts go out as they come; a function call goes out whole, once its
    arguments are complete (Google's stream never splits one), in the closing chunk with
    the finish reason and usage. Only choice 0 is translated.
    """

    def __init__(self, *, model: str, thoughts: bool) -> None:
        self._model = model
        self._thoughts = thoughts
        self._id: Any = None
        self._calls: dict[int, StreamedCall] = {}
        self._finish: Any = None
        self._usage: ChatUsage = {}
        self._done = False

    def feed(self, chunk: ChatChunk) -> list[StreamChunk]:
        self._id = self._id or chunk.get("id")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        parts: list[Part] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = _reasoning(delta)
            if reasoning and self._thoughts:
                parts.append({"text": reasoning, "thought": True})
            if isinstance(delta.get("content"), str) and delta["content"]:
                parts.append({"text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        if not parts:
            return []
        return [_response(parts, finish=None, usage=None, model=self._model, response_id=self._id)]

    def _add_call(self, delta: ToolCallDelta) -> None:
        call = self._calls.setdefault(
            delta.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}}
        )
        call["id"] = call["id"] or delta.get("id")
        function = delta.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def finish(self) -> list[StreamChunk]:
        if self._done:
            return []
        self._done = True
        parts = [_function_call(self._calls[i]) for i in sorted(self._calls)]
        return [
            _response(
                parts or [{"text": ""}],
                finish=self._finish or "stop",
                usage=self._usage,
                model=self._model,
                response_id=self._id,
            )
        ]

    def error(self, message: str) -> list[StreamChunk]:
        self._done = True
        return [error_body(500, message)]
