"""OpenAI-compatible routes: chat completions and completions recorded, other /v1/* forwarded."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from proxy.api.dialect import OpenAIDialect
from proxy.base.capture import CHAT, COMPLETIONS
from proxy.base.errors import Forbidden, ProxyError, error_response
from proxy.base.keys import upstream_view
from proxy.base.requests import read_body, session_key
from proxy.generation.call import Generation
from proxy.state import ProxyState
from proxy.upstream.replicas import UPSTREAM_READ_ERRORS

log = logging.getLogger("onthejob.proxy")

# vLLM's runtime LoRA management lives under /v1 but must never be reachable through us.
BLOCKED = {"load_lora_adapter", "unload_lora_adapter"}
# generation routes are answered (and recorded) by their own handlers; a variant of their
# path (trailing slash, /batch, ...) must not slip through unrecorded
RECORDED = {"chat", "completions", "responses", "messages"}


def _refuse_passthrough(path: str) -> str | None:
    """Why a /v1/* path may not be forwarded, or None. Checked on the decoded path:
    dot segments or encoded separators could otherwise reach vLLM's dev-mode routes."""
    segments = path.split("/")[2:]
    if any(seg in (".", "..") or "\\" in seg or "%" in seg for seg in segments):
        return "path segments '.', '..', backslashes and escapes are not forwarded"
    if segments and segments[0] in BLOCKED:
        return "not available through the proxy"
    if segments and segments[0] in RECORDED:
        return "use the exact route (e.g. /v1/chat/completions) so the call is recorded"
    return None


def _state(request: Request) -> ProxyState:
    return request.app.state.proxy


CHAT_DIALECT = OpenAIDialect(CHAT, "/v1/chat/completions")
COMPLETIONS_DIALECT = OpenAIDialect(COMPLETIONS, "/v1/completions")


async def chat_completions(request: Request) -> Response:
    return await Generation(request, CHAT_DIALECT).run()


async def completions(request: Request) -> Response:
    return await Generation(request, COMPLETIONS_DIALECT).run()


HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "server",
    "date",
}


async def passthrough(request: Request) -> Response:
    """Any other /v1/* route, forwarded untouched (not recorded: it samples no tokens)."""
    state = _state(request)
    path = "/v1/" + request.path_params["path"]
    refusal = _refuse_passthrough(path)
    if refusal is not None:
        return error_response(Forbidden(f"{path}: {refusal}"))
    try:
        key_name = state.keys.identify(request.headers)
        session = session_key(request)
        body = await read_body(request, state.settings.max_body_bytes)
        if request.url.query:
            path += "?" + request.url.query
        headers = state.pool.headers(upstream_view(request.headers, key_name))
        if request.headers.get("content-type"):
            headers["Content-Type"] = request.headers["content-type"]
        _, response = await state.pool.open(
            request.method,
            path,
            body=body or None,
            headers=headers,
            sticky_key=None if session is None else "s:" + session,
        )
    except ProxyError as exc:
        return error_response(exc)
    out_headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP}

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for piece in response.content.iter_any():
                yield piece
        except UPSTREAM_READ_ERRORS:
            log.warning("upstream broke off %s", path)
        finally:
            await state.pool.release(response)

    return StreamingResponse(relay(), status_code=response.status, headers=out_headers)


def generation_routes() -> list[BaseRoute]:
    """Plain Starlette routes: no per-request validation on the hot path."""
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        out += [
            Route(prefix + "/v1/chat/completions", chat_completions, methods=["POST"]),
            Route(prefix + "/v1/completions", completions, methods=["POST"]),
        ]
    return out


def passthrough_routes() -> list[BaseRoute]:
    """The /v1/* catch-all: it must come after every other /v1 route."""
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return [
        Route(prefix + "/v1/{path:path}", passthrough, methods=methods)
        for prefix in ("", "/s/{session}")
    ]
