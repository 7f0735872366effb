"""Token capture: ask vLLM for token ids and logprobs, hand the client only what it asked for.

Pure functions over parsed JSON, no I/O. Invariant: for a client that did not ask for token
ids or logprobs, the body it receives equals what vLLM sends without those flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from store.json_types import JsonObject, JsonValue
from store.trajectory_record import RecordedChoice

CHAT = "chat.completions"
# vLLM 0.32 names the field `reasoning`; older servers and some clients `reasoning_content`
REASONING_KEYS = ("reasoning", "reasoning_content")
COMPLETIONS = "completions"


class FunctionCall(TypedDict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(TypedDict):
    """A chat tool call, as a streamed one is assembled."""

    id: str | None
    type: str
    function: FunctionCall


class ReplyMessage(TypedDict):
    """The assistant message a chat choice produced, as a client sends it back."""

    role: str
    content: JsonValue  # text, or a list of content parts
    tool_calls: NotRequired[list[ToolCall]]
    reasoning: NotRequired[str]  # streamed only


@dataclass(frozen=True)
class ClientAsked:
    """Which capture fields the client itself requested (those it keeps)."""

    token_ids: bool
    logprobs: bool
    stream_usage: bool


def prepare_upstream_body(api: str, body: JsonObject) -> tuple[JsonObject, ClientAsked]:
    """The body sent upstream: the client's, plus the flags that make vLLM return tokens."""
    upstream = dict(body)
    stream_options = body.get("stream_options")
    asked = ClientAsked(
        token_ids=bool(body.get("return_token_ids")),
        logprobs=_asked_logprobs(api, body),
        stream_usage=isinstance(stream_options, dict) and bool(stream_options.get("include_usage")),
    )
    upstream["return_token_ids"] = True
    if not asked.logprobs:
        upstream["logprobs"] = True if api == CHAT else 0
    if body.get("stream"):
        options = dict(stream_options) if isinstance(stream_options, dict) else {}
        options["include_usage"] = True
        upstream["stream_options"] = options
    return upstream, asked


def _asked_logprobs(api: str, body: JsonObject) -> bool:
    value = body.get("logprobs")
    if api == CHAT:
        return bool(value)
    return value is not None and value is not False


@dataclass
class ChoiceCapture:
    """What one sampled choice produced, token-exact."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    # chat: the assistant message as a client would send it back; completions: the text
    message: ReplyMessage | None = None
    text: str = ""
    prompt_token_ids: list[int] | None = None

    def as_record(self) -> RecordedChoice:
        return {
            "index": self.index,
            "token_ids": self.token_ids,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
        }


@dataclass
class Capture:
    prompt_token_ids: list[int] | None = None
    choices: list[ChoiceCapture] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def complete(self) -> bool:
        """Captured ids agree with upstream usage; an incomplete capture is never trained on."""
        if self.prompt_token_ids is None or not self.choices:
            return False
        if self.prompt_tokens is not None and self.prompt_tokens != len(self.prompt_token_ids):
            return False
        for choice in self.choices:
            if len(choice.logprobs) != len(choice.token_ids):
                return False
        captured = sum(len(c.token_ids) for c in self.choices)
        return self.completion_tokens is not None and captured == self.completion_tokens


def _choice_logprobs(api: str, logprobs: Any) -> list[float]:
    if not isinstance(logprobs, dict):
        return []
    if api == CHAT:
        return [float(entry["logprob"]) for entry in logprobs.get("content") or []]
    return [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]


def _usage(capture: Capture, usage: Any) -> None:
    if isinstance(usage, dict):
        capture.prompt_tokens = usage.get("prompt_tokens")
        capture.completion_tokens = usage.get("completion_tokens")


def capture_response(api: str, data: JsonObject) -> Capture:
    """Capture from a whole (non-streaming) upstream response."""
    capture = Capture(prompt_token_ids=data.get("prompt_token_ids"))
    for raw in data.get("choices") or []:
        choice = ChoiceCapture(
            index=raw.get("index", 0),
            token_ids=list(raw.get("token_ids") or []),
            logprobs=_choice_logprobs(api, raw.get("logprobs")),
            finish_reason=raw.get("finish_reason"),
        )
        if api == CHAT:
            choice.message = reply_message(raw.get("message") or {})
        else:
            choice.text = raw.get("text") or ""
            choice.prompt_token_ids = raw.get("prompt_token_ids")
        capture.choices.append(choice)
    if capture.prompt_token_ids is None and capture.choices:
        capture.prompt_token_ids = capture.choices[0].prompt_token_ids
    capture.choices.sort(key=lambda c: c.index)
    _usage(capture, data.get("usage"))
    return capture


def reply_message(message: JsonObject) -> ReplyMessage:
    """The assistant message as the client will send it back in its next call."""
    reply: ReplyMessage = {"role": message.get("role") or "assistant"}
    reply["content"] = message.get("content")
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    return reply


def strip_response(api: str, data: JsonObject, asked: ClientAsked) -> None:
    """Undo, in place, what the proxy's flags changed in a whole response.

    vLLM keeps the keys and sends null when a flag is off, so null them, never delete them.
    """
    if not asked.token_ids:
        _null(data, "prompt_token_ids")
    for choice in data.get("choices") or []:
        if not asked.token_ids:
            _null(choice, "token_ids")
            _null(choice, "prompt_token_ids")
        if not asked.logprobs:
            _null(choice, "logprobs")


def _null(container: JsonObject, key: str) -> None:
    if key in container:
        container[key] = None


class StreamAssembler:
    """Builds the capture and the whole response from streamed chunks, in arrival order."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.capture = Capture()
        self._choices: dict[int, ChoiceCapture] = {}
        self._content: dict[int, list[str]] = {}
        self._reasoning: dict[int, list[str]] = {}
        self._tool_calls: dict[int, dict[int, ToolCall]] = {}
        self._role: dict[int, str] = {}
        self.head: JsonObject = {}  # id, created, model of the first chunk
        self.saw_output = False

    def add(self, chunk: JsonObject) -> None:
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        if chunk.get("prompt_token_ids") is not None:
            self.capture.prompt_token_ids = chunk["prompt_token_ids"]
        if chunk.get("usage"):
            _usage(self.capture, chunk["usage"])
        for raw in chunk.get("choices") or []:
            self._add_choice(raw)

    def _add_choice(self, raw: JsonObject) -> None:
        index = raw.get("index", 0)
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = ChoiceCapture(index=index)
        if raw.get("token_ids"):
            choice.token_ids.extend(raw["token_ids"])
            self.saw_output = True
        choice.logprobs.extend(_choice_logprobs(self.api, raw.get("logprobs")))
        if raw.get("finish_reason") is not None:
            choice.finish_reason = raw["finish_reason"]
        if self.api == COMPLETIONS:
            if raw.get("text"):
                self._content.setdefault(index, []).append(raw["text"])
                self.saw_output = True
            if raw.get("prompt_token_ids") is not None:
                choice.prompt_token_ids = raw["prompt_token_ids"]
                if self.capture.prompt_token_ids is None:
                    self.capture.prompt_token_ids = raw["prompt_token_ids"]
            return
        delta = raw.get("delta") or {}
        if delta.get("role"):
            self._role[index] = delta["role"]
        if delta.get("content"):
            self._content.setdefault(index, []).append(delta["content"])
            self.saw_output = True
        for key in REASONING_KEYS:
            if delta.get(key):
                self._reasoning.setdefault(index, []).append(delta[key])
        for call in delta.get("tool_calls") or []:
            self.saw_output = True
            slots = self._tool_calls.setdefault(index, {})
            slot = slots.setdefault(
                call.get("index", len(slots)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["function"]["name"] += function["name"]
            if function.get("arguments"):
                slot["function"]["arguments"] += function["arguments"]

    def finish(self) -> Capture:
        """The capture, with each choice's assembled message or text."""
        for index, choice in sorted(self._choices.items()):
            text = "".join(self._content.get(index, []))
            if self.api == CHAT:
                message: ReplyMessage = {
                    "role": self._role.get(index, "assistant"),
                    "content": text or None,
                }
                if index in self._reasoning:
                    message["reasoning"] = "".join(self._reasoning[index])
                calls = self._tool_calls.get(index)
                if calls:
                    message["tool_calls"] = [calls[k] for k in sorted(calls)]
                choice.message = message
            else:
                choice.text = text
        self.capture.choices = [self._choices[i] for i in sorted(self._choices)]
        return self.capture

    def response(self) -> JsonObject:
        """The assembled response, shaped like the non-streaming one."""
        capture = self.finish()
        choices = []
        for choice in capture.choices:
            if self.api == CHAT:
                body: JsonObject = {"index": choice.index, "message": choice.message}
            else:
                body = {"index": choice.index, "text": choice.text}
            body["finish_reason"] = choice.finish_reason
            choices.append(body)
        out: JsonObject = {
            **self.head,
            "object": "chat.completion" if self.api == CHAT else "text_completion",
            "choices": choices,
        }
        if capture.completion_tokens is not None:
            out["usage"] = {
                "prompt_tokens": capture.prompt_tokens,
                "completion_tokens": capture.completion_tokens,
            }
        return out


class ChunkFilter:
    """Turns the upstream's chunks into those vLLM would have streamed without our flags.

    - token ids, prompt token ids and logprobs the client did not ask for become null;
    - with neither flag, vLLM skips chat chunks whose token made no text (`"delta": {}`),
      so those are dropped;
    - without the client's include_usage, the usage chunk is dropped, and its
      system_fingerprint goes back onto the finishing chunks, held until it arrives.
    """

    def __init__(self, api: str, asked: ClientAsked) -> None:
        self.api = api
        self.asked = asked
        self._drop_empty = api == CHAT and not (asked.token_ids or asked.logprobs)
        self._held: list[JsonObject] = []

    def feed(self, chunk: JsonObject) -> list[JsonObject]:
        """Chunks to send the client now, in order."""
        choices = chunk.get("choices") or []
        if not self.asked.stream_usage and chunk.get("usage") and not choices:
            fingerprint = chunk.get("system_fingerprint")
            held, self._held = self._held, []
            for finishing in held:
                if fingerprint is not None and _finishes(finishing):
                    finishing["system_fingerprint"] = fingerprint
            return held
        if self._drop_empty and choices and all(_is_empty(c) for c in choices):
            return []
        if not self.asked.stream_usage:
            chunk.pop("usage", None)  # continuous_usage_stats the client did not get
        if not self.asked.token_ids:
            _null(chunk, "prompt_token_ids")
        for choice in choices:
            if not self.asked.token_ids:
                _null(choice, "token_ids")
                _null(choice, "prompt_token_ids")
            if not self.asked.logprobs:
                _null(choice, "logprobs")
        if not self.asked.stream_usage and _finishes(chunk):
            self._held.append(chunk)
            return []
        if self._held:  # never reorder: later chunks wait behind held ones
            self._held.append(chunk)
            return []
        return [chunk]

    def end(self) -> list[JsonObject]:
        """Whatever is still held when the upstream stream ends."""
        held, self._held = self._held, []
        return held


def _finishes(chunk: JsonObject) -> bool:
    return any(c.get("finish_reason") for c in chunk.get("choices") or [])


def _is_empty(choice: JsonObject) -> bool:
    return choice.get("delta") == {} and choice.get("finish_reason") is None
