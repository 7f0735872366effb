"""Anthropic Messages API (`/v1/messages`), answered through an upstream chat call.

Translating (instead of forwarding to vLLM's own /v1/messages) is what gets token ids and
logprobs recorded; the translation itself lives in proxy/api/translate/messages.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.api.dialect import TranslatedWriter
from proxy.api.translate import context_edits
from proxy.api.translate import messages as translate
from proxy.api.translate.shapes import ChatCompletion, ChatMessage, ChatRequest
from proxy.base.capture import CHAT, ClientAsked
from proxy.base.compat_policy import Compat, note_refusal
from proxy.base.errors import BadRequest, ProxyError, upstream_error_message
from proxy.base.keys import upstream_view
from proxy.base.record import CallRecord
from proxy.base.requests import parse_object, read_body
from proxy.generation.call import Generation
from proxy.generation.dialect import StreamWriter
from proxy.generation.prompt_tokens import count_prompt
from proxy.state import ProxyState
from store.json_types import JsonObject

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


def _events(events: list[translate.Event]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
        for name, data in events
    )


class MessagesDialect:
    api = "messages"
    capture_api = CHAT
    upstream_path = "/v1/chat/completions"
    output_limit = "max_tokens"

    async def to_upstream(
        self, body: JsonObject, state: ProxyState, record: CallRecord
    ) -> JsonObject:
        compat = record.compat = Compat()
        try:
            chat = translate.messages_to_chat(
                body, compat=compat, hosted_tools=state.settings.hosted_tools
            )
            clearing = translate.tool_use_clearing(body)
        except translate.TranslationError as exc:
            note_refusal(compat, exc.param, exc.message)
            raise BadRequest(str(exc), param=exc.param) from exc
        # the conversation as the client holds it: what its next call continues
        record.chat_messages = chat["messages"]
        if clearing is not None:
            headers = record.context["client_headers"]
            chat["messages"] = await _clear_tool_uses(chat, clearing, state, headers, compat)
        record.context["context_management"] = context_edits.applied_edits(compat.detail)
        return chat

    def error(self, exc: ProxyError) -> Response:
        return anthropic_error(exc.status, exc.message)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return anthropic_error(status, upstream_error_message(raw))

    def whole(self, data: JsonObject, asked: ClientAsked, record: CallRecord) -> Any:
        return _message(data, record)

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        translator = translate.MessagesStream(
            model=record.model or "",
            context_management=record.context.get("context_management"),
        )
        return TranslatedWriter(translator, _events)

    def streamed(self, assembled: JsonObject, writer: StreamWriter, record: CallRecord) -> Any:
        return _message(assembled, record)


def _message(chat: ChatCompletion, record: CallRecord) -> translate.Message:
    return translate.chat_to_message(
        chat,
        model=record.model or "",
        context_management=record.context.get("context_management"),
    )


async def _clear_tool_uses(
    chat: ChatRequest,
    clearing: context_edits.ToolUseClearing,
    state: ProxyState,
    headers: Mapping[str, str],
    compat: Compat,
) -> list[ChatMessage]:
    """The messages the model sees once `clear_tool_uses` ran: old tool results cleared if
    its trigger fired and it cleared at least `clear_at_least` tokens; the record says what."""
    messages = chat["messages"]
    detail: context_edits.ToolUseClearingDetail = {}
    compat.detail[f"context_management.{context_edits.CLEAR_TOOL_USES}"] = detail
    counted = clearing.trigger_tool_uses is None or clearing.clear_at_least > 0
    before = (await count_prompt(state.pool, chat, headers)).tokens if counted else None
    detail["input_tokens"] = before
    if not clearing.triggered(
        prompt_tokens=before, tool_uses=context_edits.tool_use_count(messages)
    ):
        detail["triggered"] = False
        return messages
    edited, cleared = context_edits.clear_tool_uses(messages, clearing)
    detail["triggered"] = True
    if cleared and before is not None:
        after = (await count_prompt(state.pool, {**chat, "messages": edited}, headers)).tokens
        detail["cleared_input_tokens"] = before - after
    if clearing.clear_at_least and detail.get("cleared_input_tokens", 0) < clearing.clear_at_least:
        detail["kept"] = "cleared fewer tokens than clear_at_least"
        return messages
    detail.update(cleared_tool_uses=len(cleared), cleared_tool_use_ids=cleared)
    return edited


DIALECT = MessagesDialect()


async def messages(request: Request) -> Response:
    return await Generation(request, DIALECT).run()


async def count_tokens(request: Request) -> Response:
    """Tokens of the prompt as vLLM's tokenizer and chat template render it (not recorded)."""
    state: ProxyState = request.app.state.proxy
    try:
        headers = upstream_view(request.headers, state.keys.identify(request.headers))
        body = parse_object(await read_body(request, state.settings.max_body_bytes))
        body.setdefault("max_tokens", 1)  # count_tokens takes no max_tokens; the check wants one
        chat = translate.count_tokens_chat_body(body, hosted_tools=state.settings.hosted_tools)
    except translate.TranslationError as exc:
        return anthropic_error(400, str(exc))
    except ProxyError as exc:
        return anthropic_error(exc.status, exc.message)
    try:
        count = await count_prompt(state.pool, chat, headers)
    except ProxyError as exc:
        return anthropic_error(exc.status, exc.message)
    return JSONResponse({"input_tokens": count.tokens})


def routes() -> list[BaseRoute]:
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        out += [
            Route(prefix + "/v1/messages", messages, methods=["POST"]),
            Route(prefix + "/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        ]
    return out
