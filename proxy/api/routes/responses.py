"""OpenAI Responses API (`/v1/responses`), answered through an upstream chat call.

`store` (default true) keeps each response, so `previous_response_id` continues it and
`GET /v1/responses/{id}` returns it; the translation lives in proxy/api/translate/responses.py.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.api.dialect import TranslatedWriter
from proxy.api.translate import responses as translate
from proxy.api.translate.shapes import ChatMessage
from proxy.base.capture import CHAT, ClientAsked
from proxy.base.compat_policy import Compat, note_refusal
from proxy.base.errors import (
    BadRequest,
    NotFound,
    ProxyError,
    ServiceUnavailable,
    error_body,
    error_response,
)
from proxy.base.record import CallRecord, StoredResponse
from proxy.generation.call import Generation
from proxy.generation.dialect import StreamWriter
from proxy.state import ProxyState
from store.json_types import JsonObject


def _events(events: list[translate.ResponsesEvent]) -> bytes:
    return b"".join(
        b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in events
    )


class ResponsesDialect:
    api = "responses"
    capture_api = CHAT
    upstream_path = "/v1/chat/completions"
    output_limit = "max_output_tokens"

    async def to_upstream(
        self, body: JsonObject, state: ProxyState, record: CallRecord
    ) -> JsonObject:
        compat = record.compat = Compat()
        history = None
        previous = body.get("previous_response_id")
        if previous is not None:
            history = await self._history(previous, state)
        try:
            chat = translate.responses_to_chat(
                body, history=history, compat=compat, hosted_tools=state.settings.hosted_tools
            )
        except translate.TranslationError as exc:
            note_refusal(compat, exc.param, exc.message)
            raise BadRequest(str(exc), param=exc.param) from exc
        record.chat_messages = chat["messages"]
        record.context.update(
            chat=chat,
            response_id=translate.new_response_id(),
            created_at=int(time.time()),
            store=body.get("store", True) is not False,
            responses=state.responses,
        )
        return chat

    @staticmethod
    async def _history(previous: Any, state: ProxyState) -> list[ChatMessage]:
        if not isinstance(previous, str):
            raise BadRequest(
                "'previous_response_id' must be a string", param="previous_response_id"
            )
        try:
            stored = await state.responses.get(previous)
        except SQLAlchemyError as exc:
            raise ServiceUnavailable(
                "stored responses are unavailable: the database is unreachable"
            ) from exc
        if stored is None:
            raise NotFound(
                f"Previous response with id '{previous}' not found.",
                param="previous_response_id",
            )
        return list(stored["conversation"])

    def error(self, exc: ProxyError) -> Response:
        return error_response(exc)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return Response(raw, status_code=status, media_type=content_type)

    def whole(self, data: JsonObject, asked: ClientAsked, record: CallRecord) -> Any:
        context = record.context
        response = translate.chat_to_response(
            data,
            request=record.request or {},
            response_id=context["response_id"],
            created_at=context["created_at"],
        )
        self._keep(response, record)
        return response

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        context = record.context
        translator = translate.ResponsesStream(
            request=record.request or {},
            response_id=context["response_id"],
            created_at=context["created_at"],
        )
        return TranslatedWriter(translator, _events)

    def streamed(self, assembled: JsonObject, writer: StreamWriter, record: CallRecord) -> Any:
        assert isinstance(writer, TranslatedWriter)
        assert isinstance(writer.stream, translate.ResponsesStream)
        response = writer.stream.response
        if response.get("status") == "completed" or response.get("status") == "incomplete":
            self._keep(response, record)
        return response

    @staticmethod
    def _keep(response: translate.Response, record: CallRecord) -> None:
        context = record.context
        if not context.get("store"):
            return
        stored: StoredResponse = {
            "id": response["id"],
            "created_at": float(context["created_at"]),
            "response": response,
            "conversation": translate.conversation_after(context["chat"], response),
        }
        record.stored_response = stored
        context["responses"].remember(stored)


DIALECT = ResponsesDialect()


async def create(request: Request) -> Response:
    return await Generation(request, DIALECT).run()


async def retrieve(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    response_id = request.path_params["response_id"]
    try:
        state.keys.identify(request.headers)
    except ProxyError as exc:
        return error_response(exc)
    try:
        stored = await state.responses.get(response_id)
    except SQLAlchemyError:
        return error_response(ServiceUnavailable("the database is unreachable"))
    if stored is None:
        return JSONResponse(
            error_body(f"Response with id '{response_id}' not found.", "invalid_request_error"),
            status_code=404,
        )
    return JSONResponse(stored["response"])


def routes() -> list[BaseRoute]:
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        out += [
            Route(prefix + "/v1/responses", create, methods=["POST"]),
            Route(prefix + "/v1/responses/{response_id}", retrieve, methods=["GET"]),
        ]
    return out
