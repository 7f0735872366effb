"""Anthropic Messages API (`/v1/messages`), answered through an upstream chat call.

Translating (instead of forwarding to vLLM's own /v1/messages) is what gets token ids and
logprobs recorded; the translation itself lives in proxy/translate/messages.py.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.capture import CHAT, ClientAsked
from proxy.dialect import StreamWriter, TranslatedWriter
from proxy.errors import BadRequest, ProxyError
from proxy.generation import UPSTREAM_READ_ERRORS, Generation, upstream_error_message
from proxy.recording import CallRecord
from proxy.requests import parse_object, read_body
from proxy.state import ProxyState
from proxy.translate import messages as translate
from proxy.upstream import release

# HTTP status -> Anthropic error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> Response:
    body = translate.error_body(message, ERROR_TYPES.get(status, "api_error"))
    return JSONResponse(body, status_code=status)


def _events(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for name, data in events
    )


class MessagesDialect:
    api = "messages"
    capture_api = CHAT
    upstream_path = "/v1/chat/completions"

    async def to_upstream(
        self, body: dict[str, Any], state: ProxyState, record: CallRecord
    ) -> dict[str, Any]:
        try:
            chat = translate.messages_to_chat(body)
        except translate.TranslationError as exc:
            raise BadRequest(str(exc), param=exc.param) from exc
        record.chat_messages = chat["messages"]
        return chat

    def error(self, exc: ProxyError) -> Response:
        return anthropic_error(exc.status, exc.message)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return anthropic_error(status, upstream_error_message(raw))

    def whole(self, data: dict[str, Any], asked: ClientAsked, record: CallRecord) -> Any:
        return translate.chat_to_message(data, model=record.model or "")

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        return TranslatedWriter(translate.MessagesStream(model=record.model or ""), _events)

    def streamed(self, assembled: dict[str, Any], writer: StreamWriter, record: CallRecord) -> Any:
        return translate.chat_to_message(assembled, model=record.model or "")


DIALECT = MessagesDialect()


async def messages(request: Request) -> Response:
    return await Generation(request, DIALECT).run()


async def count_tokens(request: Request) -> Response:
    """Tokens of the prompt as vLLM's tokenizer and chat template render it (not recorded)."""
    state: ProxyState = request.app.state.proxy
    try:
        body = parse_object(await read_body(request, state.settings.max_body_bytes))
        body.setdefault("max_tokens", 1)  # count_tokens takes no max_tokens; the check wants one
        chat = translate.count_tokens_chat_body(body)
    except translate.TranslationError as exc:
        return anthropic_error(400, str(exc))
    except ProxyError as exc:
        return anthropic_error(exc.status, exc.message)
    tokenize = {
        "model": chat.get("model"),
        "messages": chat["messages"],
        "add_generation_prompt": True,
    }
    if chat.get("tools"):
        tokenize["tools"] = chat["tools"]
    try:
        _, response = await state.pool.open(
            "POST",
            "/tokenize",
            body=orjson.dumps(tokenize),
            headers=state.pool.headers(request.headers),
            sticky_key=None,
        )
    except ProxyError as exc:
        return anthropic_error(exc.status, exc.message)
    try:
        raw = await response.read()
    except UPSTREAM_READ_ERRORS as exc:
        return anthropic_error(502, f"upstream broke off while counting tokens: {exc}")
    finally:
        await release(response)
    if response.status != 200:
        return anthropic_error(response.status, upstream_error_message(raw))
    try:
        count = int(orjson.loads(raw)["count"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return anthropic_error(502, "upstream's /tokenize answered without a token count")
    return JSONResponse({"input_tokens": count})


def routes() -> list[BaseRoute]:
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        out += [
            Route(prefix + "/v1/messages", messages, methods=["POST"]),
            Route(prefix + "/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        ]
    return out
