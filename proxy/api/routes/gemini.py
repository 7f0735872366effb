"""Gemini API (`/v1beta/models/{model}:generateContent` and friends), answered through an
upstream chat call, so Gemini CLI and the google-genai SDKs run unchanged with their base URL
at the proxy (`GOOGLE_GEMINI_BASE_URL`).

`:streamGenerateContent` streams Server-Sent Events with `?alt=sse` (what the SDKs ask for),
else a JSON array as it grows, as Google's servers do. The translation lives in
proxy/api/translate/gemini.py; the key comes as `x-goog-api-key` (proxy/base/keys.py), or as
Google's REST API also takes it, in the query string (`?key=`), read as if it were that header.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.api.dialect import TranslatedWriter
from proxy.api.translate import gemini as translate
from proxy.api.translate.messages import TranslationError
from proxy.base.capture import CHAT, ClientAsked
from proxy.base.compat_policy import Compat, note_refusal
from proxy.base.errors import (
    BadRequest,
    ProxyError,
    UpstreamUnavailable,
    upstream_error_message,
)
from proxy.base.keys import upstream_view
from proxy.base.record import CallRecord
from proxy.base.requests import parse_object, read_body
from proxy.generation.call import Generation
from proxy.generation.dialect import StreamWriter
from proxy.generation.prompt_tokens import count_prompt
from proxy.state import ProxyState
from proxy.upstream.replicas import UPSTREAM_READ_ERRORS
from store.json_types import JsonObject

VERSIONS = ("v1beta", "v1")
ACTIONS = ("generateContent", "streamGenerateContent", "countTokens")


class Model(TypedDict, total=False):
    """A served model as Gemini's model list shows it."""

    name: str  # "models/<id>"
    baseModelId: str
    version: str
    displayName: str
    supportedGenerationMethods: list[str]
    inputTokenLimit: int  # vLLM's max_model_len, when it says
    outputTokenLimit: int


def key_from_query(request: Request) -> None:
    """`?key=K` counts as `x-goog-api-key: K` (the header wins where both come), before
    anything reads the request's headers."""
    key = request.query_params.get("key")
    if key and b"x-goog-api-key" not in dict(request.scope["headers"]):
        request.scope["headers"] = [*request.scope["headers"], (b"x-goog-api-key", key.encode())]
        request.__dict__.pop("_headers", None)


def gemini_error(status: int, message: str) -> Response:
    return JSONResponse(translate.error_body(status, message), status_code=status)


class SSE:
    """Gemini's `alt=sse` framing: one `data:` event per response chunk."""

    def __call__(self, chunks: list[translate.StreamChunk]) -> bytes:
        return b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)


class JSONArray:
    """Without `alt=sse`: one JSON array, its elements sent as they come."""

    def __init__(self) -> None:
        self.opened = False

    def __call__(self, chunks: list[translate.StreamChunk]) -> bytes:
        out = b""
        for chunk in chunks:
            out += (b",\r\n" if self.opened else b"[") + orjson.dumps(chunk)
            self.opened = True
        return out

    def end(self) -> bytes:
        return b"]" if self.opened else b"[]"


class ArrayWriter(TranslatedWriter):
    """A TranslatedWriter that closes the JSON array once, however the stream ends."""

    def __init__(self, stream: translate.GeminiStream) -> None:
        self.array = JSONArray()
        super().__init__(stream, self.array)

    def _close(self, closing: Any) -> bytes:
        if self._closed:
            return b""
        return super()._close(closing) + self.array.end()


class GeminiDialect:
    api = "gemini"
    capture_api = CHAT
    upstream_path = "/v1/chat/completions"
    output_limit = "generationConfig.maxOutputTokens"

    def __init__(self, model: str, *, stream: bool, sse: bool) -> None:
        self.model = model
        self.streaming = stream
        self.sse = sse
        self.thoughts = False

    async def to_upstream(
        self, body: JsonObject, state: ProxyState, record: CallRecord
    ) -> JsonObject:
        # the model and streaming are in the URL, not the body
        record.model = self.model
        record.stream = self.streaming
        compat = record.compat = Compat()
        try:
            chat = translate.gemini_to_chat(
                body, model=self.model, compat=compat, hosted_tools=state.settings.hosted_tools
            )
        except TranslationError as exc:
            note_refusal(compat, exc.param, exc.message)
            raise BadRequest(str(exc), param=exc.param) from exc
        self.thoughts = translate.includes_thoughts(body)
        record.chat_messages = chat["messages"]
        if self.streaming:
            chat["stream"] = True
        return chat

    def error(self, exc: ProxyError) -> Response:
        return gemini_error(exc.status, exc.message)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return gemini_error(status, upstream_error_message(raw))

    def whole(self, data: JsonObject, asked: ClientAsked, record: CallRecord) -> Any:
        return translate.chat_to_gemini(data, model=self.model, thoughts=self.thoughts)

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        translator = translate.GeminiStream(model=self.model, thoughts=self.thoughts)
        if self.sse:
            return TranslatedWriter(translator, SSE())
        return ArrayWriter(translator)

    def streamed(self, assembled: JsonObject, writer: StreamWriter, record: CallRecord) -> Any:
        return translate.chat_to_gemini(assembled, model=self.model, thoughts=self.thoughts)


def _model_action(request: Request) -> tuple[str, str] | None:
    model, _, action = request.path_params["model_action"].rpartition(":")
    if not model or action not in ACTIONS:
        return None
    return model.removeprefix("models/"), action


async def model_action(request: Request) -> Response:
    key_from_query(request)
    found = _model_action(request)
    if found is None:
        return gemini_error(
            404,
            f"{request.url.path}: not a method this proxy serves "
            f"(models/MODEL:{', :'.join(ACTIONS)})",
        )
    model, action = found
    if action == "countTokens":
        return await count_tokens(request, model)
    stream = action == "streamGenerateContent"
    dialect = GeminiDialect(model, stream=stream, sse=request.query_params.get("alt") == "sse")
    return await Generation(request, dialect).run()


async def count_tokens(request: Request, model: str) -> Response:
    """Tokens of the prompt as vLLM's tokenizer and chat template render it (not recorded)."""
    state: ProxyState = request.app.state.proxy
    try:
        headers = upstream_view(request.headers, state.keys.identify(request.headers))
        body = parse_object(await read_body(request, state.settings.max_body_bytes))
        chat = translate.count_tokens_chat_body(body, model=model)
        count = await count_prompt(state.pool, chat, headers)
    except TranslationError as exc:
        return gemini_error(400, str(exc))
    except ProxyError as exc:
        return gemini_error(exc.status, exc.message)
    return JSONResponse({"totalTokens": count.tokens})


async def _served(request: Request) -> list[Model]:
    """The upstream's models (vLLM's /v1/models) in Gemini's shape; an upstream that fails
    to list them is a 502 with its reason."""
    key_from_query(request)
    state: ProxyState = request.app.state.proxy
    client = upstream_view(request.headers, state.keys.identify(request.headers))
    _, response = await state.pool.open(
        "GET", "/v1/models", body=None, headers=state.pool.headers(client), sticky_key=None
    )
    try:
        raw = await response.read()
    except UPSTREAM_READ_ERRORS as exc:
        raise UpstreamUnavailable(f"the upstream's model list broke off: {exc}") from exc
    finally:
        await state.pool.release(response)
    if response.status != 200:
        raise UpstreamUnavailable(
            f"the upstream answered {response.status} for its model list: "
            f"{upstream_error_message(raw)}"
        )
    return [_model(m) for m in orjson.loads(raw).get("data") or [] if isinstance(m, dict)]


def _model(served: JsonObject) -> Model:
    name = str(served.get("id"))
    context = served.get("max_model_len")
    model: Model = {
        "name": f"models/{name}",
        "baseModelId": name,
        "version": "served",
        "displayName": name,
        "supportedGenerationMethods": list(ACTIONS),
    }
    if isinstance(context, int):
        model["inputTokenLimit"] = context
        model["outputTokenLimit"] = context
    return model


async def list_models(request: Request) -> Response:
    try:
        return JSONResponse({"models": await _served(request)})
    except ProxyError as exc:
        return gemini_error(exc.status, exc.message)


async def get_model(request: Request) -> Response:
    wanted = request.path_params["model"]
    try:
        found = [m for m in await _served(request) if m["baseModelId"] == wanted]
    except ProxyError as exc:
        return gemini_error(exc.status, exc.message)
    if not found:
        return gemini_error(404, f"models/{wanted} is not served here")
    return JSONResponse(found[0])


def routes() -> list[BaseRoute]:
    """Generation under /v1beta and /v1; the model list under /v1beta only: GET /v1/models
    is the OpenAI API's, passed through to vLLM."""
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        for version in VERSIONS:
            path = f"{prefix}/{version}/models/{{model_action}}"
            out.append(Route(path, model_action, methods=["POST"]))
        out += [
            Route(prefix + "/v1beta/models", list_models, methods=["GET"]),
            Route(prefix + "/v1beta/models/{model}", get_model, methods=["GET"]),
        ]
    return out
