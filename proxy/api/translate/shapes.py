"""The chat completions API's shapes, as the translators build and read them.

Every translated API (Responses, Messages, Gemini) becomes a chat request for vLLM, and its
answer comes back as a chat completion or a stream of chunks; these name the parts whose keys
are known. The client bodies themselves stay `JsonObject` (store/json_types.py): newer
clients add fields, and the compatibility policy passes unknown ones through or records them.

What vLLM sends is read defensively (`.get`, isinstance): a TypedDict here names what is
expected, nothing validates it, and vLLM's extensions (e.g. `prompt_token_ids`) may ride
along. Values a client gave are passed on as given; vLLM validates them.
"""

from __future__ import annotations

from typing import Required, TypeAlias, TypedDict

from store.json_types import JsonObject, JsonValue

# --- request: what the translators send upstream -------------------------------------------


class ChatFunctionCall(TypedDict):
    name: str
    arguments: str  # JSON text


class ChatToolCall(TypedDict):
    """A tool call of an assistant message (request) or of a whole completion (answer)."""

    id: str
    type: str  # "function"
    function: ChatFunctionCall


class ChatTextPart(TypedDict):
    type: str  # "text"
    text: str


class ImageUrl(TypedDict):
    url: str  # a data: URL here


class ChatImagePart(TypedDict):
    type: str  # "image_url"
    image_url: ImageUrl


ChatContentPart: TypeAlias = ChatTextPart | ChatImagePart


class ChatMessage(TypedDict, total=False):
    """A chat message: one the translators build, or the one a completion answers with."""

    role: Required[str]  # system | user | assistant | tool
    content: str | list[ChatContentPart] | None
    tool_calls: list[ChatToolCall]
    tool_call_id: str  # a tool message: the call it answers
    # the assistant's reasoning; vLLM reads `reasoning` and may answer with either name
    # (proxy/base/capture.py REASONING_KEYS)
    reasoning: str
    reasoning_content: str


class ChatFunction(TypedDict, total=False):
    name: Required[str]
    description: str
    parameters: JsonValue  # the client's JSON Schema
    strict: bool


class ChatTool(TypedDict):
    type: str  # "function"
    function: ChatFunction


class FunctionName(TypedDict):
    name: str


class NamedToolChoice(TypedDict):
    """A `tool_choice` that forces one function."""

    type: str  # "function"
    function: FunctionName


# "auto", "none", "required", or one named function
ChatToolChoice: TypeAlias = str | NamedToolChoice


class JsonSchemaFormat(TypedDict, total=False):
    name: Required[str]
    description: str
    schema: JsonValue
    strict: bool


class ResponseFormat(TypedDict, total=False):
    type: Required[str]  # "json_object" or "json_schema"
    json_schema: JsonSchemaFormat


class ChatRequest(TypedDict, total=False):
    """The chat completions request a translator builds (before the capture flags)."""

    model: str
    messages: list[ChatMessage]
    tools: list[ChatTool]
    tool_choice: ChatToolChoice
    parallel_tool_calls: bool
    max_tokens: int
    stream: bool
    temperature: float
    top_p: float
    top_k: int
    stop: str | list[str]
    user: str
    response_format: ResponseFormat
    reasoning_effort: str
    logprobs: bool
    top_logprobs: int
    add_generation_prompt: bool
    continue_final_message: bool
    chat_template_kwargs: JsonObject
    # the rest of vLLM's own extensions (proxy/api/translate/extras.py VLLM_EXTRAS)
    seed: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    ignore_eos: bool
    structured_outputs: JsonObject


# --- answer: what vLLM sends back -----------------------------------------------------------


class ChatUsage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: JsonObject | None  # cached_tokens
    completion_tokens_details: JsonObject | None  # reasoning_tokens


class ChatTokenLogprob(TypedDict, total=False):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[ChatTokenLogprob]


class ChatLogprobs(TypedDict, total=False):
    content: list[ChatTokenLogprob] | None


class ChatChoice(TypedDict, total=False):
    index: int
    message: ChatMessage
    finish_reason: str | None
    stop_reason: str | int | None  # vLLM's: the stop string matched, or a stop token id
    logprobs: ChatLogprobs | None


class ChatCompletion(TypedDict, total=False):
    """A whole chat completion (or a stream's chunks assembled into one)."""

    id: str
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage | None


class FunctionCallDelta(TypedDict, total=False):
    name: str | None
    arguments: str | None


class ToolCallDelta(TypedDict, total=False):
    """A piece of a streamed tool call; `index` says which call it continues."""

    index: int
    id: str | None
    type: str
    function: FunctionCallDelta


class ChatDelta(TypedDict, total=False):
    role: str
    content: str | None
    reasoning: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCallDelta]


class ChunkChoice(TypedDict, total=False):
    index: int
    delta: ChatDelta
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: ChatLogprobs | None


class ChatChunk(TypedDict, total=False):
    """One `chat.completion.chunk` of a stream."""

    id: str
    model: str
    choices: list[ChunkChoice]
    usage: ChatUsage | None
    prompt_token_ids: list[int] | None  # vLLM's, on the first chunk when asked
