"""OpenAI-compatible routes: chat completions and completions recorded, other /v1/* forwarded.

Every generation call produces exactly one CallRecord, whatever happens: refused, failed
upstream, answered, broken off mid-stream or cancelled by the client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from proxy.capture import (
    CHAT,
    COMPLETIONS,
    ChunkFilter,
    ClientAsked,
    StreamAssembler,
    capture_response,
    prepare_upstream_body,
    strip_response,
)
from proxy.errors import (
    Forbidden,
    ProxyError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_response,
    sse_error_event,
)
from proxy.recording import CallRecord
from proxy.requests import check_generation, parse_object, read_body, session_key, sticky_key
from proxy.state import ProxyState
from proxy.stitching import new_id
from proxy.streaming import response_to_chunks
from proxy.upstream import Replica, release

log = logging.getLogger("onthejob.proxy")

# vLLM's runtime LoRA management lives under /v1 but must never be reachable through us.
BLOCKED_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
UPSTREAM_READ_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError)


def _state(request: Request) -> ProxyState:
    return request.app.state.proxy


class Generation:
    """One recorded generation call, from the client's bytes to the record."""

    def __init__(self, request: Request, api: str, path: str) -> None:
        self.request = request
        self.api = api
        self.path = path
        self.state = _state(request)
        self.t0 = time.perf_counter()
        self.record = CallRecord(id=new_id(), api=api, session_key=None, started_at=time.time())

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0

    def finish(
        self, *, status: str = "ok", http_status: int = 200, error: str | None = None
    ) -> None:
        record = self.record
        record.status, record.http_status, record.error = status, http_status, error
        record.latency_ms = self.elapsed_ms()
        self.state.recorder.record(record)

    def fail(self, exc: ProxyError) -> Response:
        if isinstance(exc, UpstreamUnavailable | UpstreamTimeout):
            log.warning("%s %s: %s", self.api, self.record.id, exc.message)
        self.record.response = exc.body()
        self.finish(status="error", http_status=exc.status, error=exc.message)
        return error_response(exc)

    async def run(self) -> Response:
        try:
            self.record.session_key = session_key(self.request)
            body = parse_object(await read_body(self.request, self.state.settings.max_body_bytes))
            self.record.request = body
            model = body.get("model")
            self.record.model = model if isinstance(model, str) else None
            self.record.stream = body.get("stream") is True
            check_generation(self.api, body)
        except ProxyError as exc:
            return self.fail(exc)
        upstream_body, asked = prepare_upstream_body(self.api, body)
        sticky = (
            sticky_key(self.record.session_key, self.api, body)
            if len(self.state.pool.replicas) > 1
            else None
        )
        if self.record.stream and self._buffer_stream(body, sticky):
            upstream_body["stream"] = False
            upstream_body.pop("stream_options", None)
            return await self._buffered_stream(upstream_body, asked, sticky)
        try:
            replica, response = await self._open(upstream_body, sticky)
        except ProxyError as exc:
            return self.fail(exc)
        if response.status != 200 or not self.record.stream:
            return await self._whole(response, asked)
        return StreamingResponse(
            self._relay(replica, response, asked, bool(body.get("tools"))),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    def _buffer_stream(self, body: dict[str, Any], sticky: str | None) -> bool:
        """Stream tool calls from a whole upstream answer where streaming loses their tokens."""
        if self.api != CHAT or not body.get("tools"):
            return False
        mode = self.state.settings.stream_tools_mode
        if mode == "auto":
            return self.state.pool.candidates(sticky)[0].drops_stream_tool_tokens
        return mode == "buffer"

    async def _open(
        self, upstream_body: dict[str, Any], sticky: str | None
    ) -> tuple[Replica, aiohttp.ClientResponse]:
        replica, response = await self.state.pool.open(
            "POST",
            self.path,
            body=orjson.dumps(upstream_body),
            headers=self.state.pool.headers(self.request.headers),
            sticky_key=sticky,
        )
        self.record.upstream = replica.url
        self.record.policy_version = replica.policy_version
        return replica, response

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except UPSTREAM_READ_ERRORS as exc:
            url = self.record.upstream
            if isinstance(exc, asyncio.TimeoutError | TimeoutError):
                raise UpstreamTimeout(f"upstream {url} timed out") from exc
            raise UpstreamUnavailable(f"upstream {url} broke off its answer: {exc}") from exc
        finally:
            await release(response)

    async def _whole(self, response: aiohttp.ClientResponse, asked: ClientAsked) -> Response:
        try:
            raw = await self._read(response)
        except ProxyError as exc:
            return self.fail(exc)
        content_type = response.headers.get("Content-Type", "application/json")
        if response.status != 200:
            # vLLM's own errors reach the client unchanged
            self.record.response = _json_or_text(raw)
            self.finish(status="error", http_status=response.status, error=_error_message(raw))
            return Response(raw, status_code=response.status, media_type=content_type)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return self.fail(
                UpstreamUnavailable(f"upstream {self.record.upstream} sent invalid JSON")
            )
        self.record.capture = capture_response(self.api, data)
        strip_response(self.api, data, asked)
        self.record.response = data
        self.finish()
        return Response(orjson.dumps(data), media_type="application/json")

    async def _buffered_stream(
        self, upstream_body: dict[str, Any], asked: ClientAsked, sticky: str | None
    ) -> Response:
        try:
            _, response = await self._open(upstream_body, sticky)
            raw = await self._read(response)
        except ProxyError as exc:
            return self.fail(exc)
        if response.status != 200:
            self.record.response = _json_or_text(raw)
            self.finish(status="error", http_status=response.status, error=_error_message(raw))
            return Response(raw, status_code=response.status, media_type="application/json")
        data = orjson.loads(raw)
        self.record.capture = capture_response(self.api, data)
        chunks = response_to_chunks(data, asked)
        strip_response(self.api, data, asked)
        self.record.response = data
        self.record.ttft_ms = self.elapsed_ms()
        self.finish()

        async def emit() -> AsyncIterator[bytes]:
            yield _encode(chunks) + b"data: [DONE]\n\n"

        return StreamingResponse(emit(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def _relay(
        self,
        replica: Replica,
        response: aiohttp.ClientResponse,
        asked: ClientAsked,
        has_tools: bool,
    ) -> AsyncIterator[bytes]:
        """Pass chunks on as they arrive while assembling the whole answer for the record."""
        assembler = StreamAssembler(self.api)
        chunk_filter = ChunkFilter(self.api, asked)
        # until the stream ends one way or another, the client is the one who left
        status, http_status, error = "cancelled", 499, "client disconnected mid-stream"
        upstream_error: str | None = None
        buffer = b""
        done = False
        try:
            async for piece in response.content.iter_any():
                buffer += piece
                parts = []
                while not done and (end := buffer.find(b"\n\n")) >= 0:
                    event, buffer = buffer[:end], buffer[end + 2 :]
                    out, done, event_error = self._relay_event(event, assembler, chunk_filter)
                    upstream_error = upstream_error or event_error
                    parts.append(out)
                if outgoing := b"".join(parts):
                    # one write per upstream read: what arrived together leaves together
                    if self.record.ttft_ms is None and assembler.saw_output:
                        self.record.ttft_ms = self.elapsed_ms()
                    yield outgoing
                if done:
                    break
            if not done:
                status, http_status = "error", 502
                error = f"upstream {replica.url} ended the stream before [DONE]"
                yield _encode(chunk_filter.end()) + sse_error_event(
                    error, code="upstream_stream_broken"
                )
            elif upstream_error is not None:
                status, http_status, error = "error", 200, upstream_error
            else:
                status, http_status, error = "ok", 200, None
        except UPSTREAM_READ_ERRORS as exc:
            status, http_status = "error", 502
            error = f"upstream {replica.url} broke off the stream: {exc or type(exc).__name__}"
            yield _encode(chunk_filter.end()) + sse_error_event(
                error, code="upstream_stream_broken"
            )
        finally:
            await release(response)
            self.record.capture = assembler.finish()
            self.record.response = assembler.response()
            self._learn_tool_token_drop(replica, has_tools)
            self.finish(status=status, http_status=http_status, error=error)

    def _relay_event(
        self, event: bytes, assembler: StreamAssembler, chunk_filter: ChunkFilter
    ) -> tuple[bytes, bool, str | None]:
        """(bytes for the client, whether it was [DONE], an upstream error message)."""
        data = b"\n".join(
            line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        )
        if not data:
            return event + b"\n\n", False, None  # comments / keep-alives pass through
        if data == b"[DONE]":
            return _encode(chunk_filter.end()) + b"data: [DONE]\n\n", True, None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return event + b"\n\n", False, None
        if not isinstance(chunk, dict):
            return event + b"\n\n", False, None
        if "error" in chunk:
            return _encode(chunk_filter.end()) + event + b"\n\n", False, _error_message(data)
        assembler.add(chunk)
        return _encode(chunk_filter.feed(chunk)), False, None

    def _learn_tool_token_drop(self, replica: Replica, has_tools: bool) -> None:
        capture = self.record.capture
        if (
            not has_tools
            or capture is None
            or capture.complete
            or capture.completion_tokens is None
        ):
            return
        if any((c.message or {}).get("tool_calls") for c in capture.choices):
            if not replica.drops_stream_tool_tokens:
                log.warning(
                    "upstream %s drops token ids of streamed tool calls; streaming requests "
                    "with tools to it are now answered from whole upstream responses",
                    replica.url,
                )
            replica.drops_stream_tool_tokens = True


def _encode(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)


def _json_or_text(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"text": raw[:65536].decode("utf-8", "replace")}


def _error_message(raw: bytes) -> str:
    parsed = _json_or_text(raw)
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if parsed.get("message"):
            return str(parsed["message"])
    return raw[:2000].decode("utf-8", "replace")


async def chat_completions(request: Request) -> Response:
    return await Generation(request, CHAT, "/v1/chat/completions").run()


async def completions(request: Request) -> Response:
    return await Generation(request, COMPLETIONS, "/v1/completions").run()


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
    if path.rstrip("/") in BLOCKED_PATHS:
        return error_response(Forbidden(f"{path} is not available through the proxy"))
    try:
        session = session_key(request)
        body = await read_body(request, state.settings.max_body_bytes)
        if request.url.query:
            path += "?" + request.url.query
        headers = state.pool.headers(request.headers)
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
            await release(response)

    return StreamingResponse(relay(), status_code=response.status, headers=out_headers)


def routes() -> list[BaseRoute]:
    """Plain Starlette routes: no per-request validation on the hot path."""
    out: list[BaseRoute] = []
    for prefix in ("", "/s/{session}"):
        out += [
            Route(prefix + "/v1/chat/completions", chat_completions, methods=["POST"]),
            Route(prefix + "/v1/completions", completions, methods=["POST"]),
            Route(
                prefix + "/v1/{path:path}",
                passthrough,
                methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            ),
        ]
    return out
