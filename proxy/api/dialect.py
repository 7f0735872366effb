"""How one client API maps onto an upstream vLLM call: the seam between HTTP and capture.

A Dialect turns the client's body into the upstream request, and the upstream's answer
(whole or streamed) into what this API's clients expect, errors included. The OpenAI
dialect passes bodies through; the Responses and Messages dialects translate to chat.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from starlette.responses import Response

from proxy.api.errors import ProxyError, error_response, sse_error_event
from proxy.api.requests import check_generation
from proxy.generation.capture import CHAT, ChunkFilter, ClientAsked, strip_response
from proxy.recording.recorder import CallRecord
from proxy.state import ProxyState


class StreamWriter(Protocol):
    """Upstream chunks in, bytes for the client out."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...
    def end(self) -> bytes: ...
    def broken(self, message: str) -> bytes:
        """The stream broke off (our detection): a terminal error for the client."""
        ...

    def upstream_error(self, event: bytes, message: str) -> bytes:
        """The upstream sent an error event mid-stream (`event` is its raw SSE event)."""
        ...


class Dialect(Protocol):
    api: str  # recorded as the call's api
    capture_api: str  # shape of the upstream call: CHAT or COMPLETIONS
    upstream_path: str
    # the client's name for the output limit the proxy lowers to fit the context
    # (translated APIs), or None: the limit is passed on as it is
    output_limit: str | None

    async def to_upstream(
        self, body: dict[str, Any], state: ProxyState, record: CallRecord
    ) -> dict[str, Any]:
        """The upstream request body (before capture flags); raises ProxyError."""
        ...

    def error(self, exc: ProxyError) -> Response: ...

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response: ...

    def whole(self, data: dict[str, Any], asked: ClientAsked, record: CallRecord) -> Any:
        """The client's body from a whole upstream response (already captured)."""
        ...

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter: ...

    def streamed(self, assembled: dict[str, Any], writer: StreamWriter, record: CallRecord) -> Any:
        """What the client got from a stream, as one object (the upstream's assembled)."""
        ...


def encode_sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)


class OpenAIStream:
    def __init__(self, api: str, asked: ClientAsked) -> None:
        self._filter = ChunkFilter(api, asked)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return encode_sse(self._filter.feed(chunk))

    def end(self) -> bytes:
        return encode_sse(self._filter.end()) + b"data: [DONE]\n\n"

    def broken(self, message: str) -> bytes:
        return encode_sse(self._filter.end()) + sse_error_event(
            message, code="upstream_stream_broken"
        )

    def upstream_error(self, event: bytes, message: str) -> bytes:
        return encode_sse(self._filter.end()) + event + b"\n\n"  # vLLM's own, unchanged


class OpenAIDialect:
    """Chat completions and completions: bodies pass through; vLLM's errors unchanged."""

    output_limit = None  # vLLM's own API: its clients get its own answer to a limit

    def __init__(self, api: str, upstream_path: str) -> None:
        self.api = api
        self.capture_api = api
        self.upstream_path = upstream_path

    async def to_upstream(
        self, body: dict[str, Any], state: ProxyState, record: CallRecord
    ) -> dict[str, Any]:
        check_generation(self.api, body)
        if self.api == CHAT:
            record.chat_messages = body["messages"]
        return body

    def error(self, exc: ProxyError) -> Response:
        return error_response(exc)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return Response(raw, status_code=status, media_type=content_type)

    def whole(self, data: dict[str, Any], asked: ClientAsked, record: CallRecord) -> Any:
        strip_response(self.api, data, asked)
        return data

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        return OpenAIStream(self.api, asked)

    def streamed(self, assembled: dict[str, Any], writer: StreamWriter, record: CallRecord) -> Any:
        return assembled


class TranslatedStream(Protocol):
    """A pure translator of upstream chat chunks into another API's stream events."""

    def feed(self, chunk: dict[str, Any]) -> list[Any]: ...
    def finish(self) -> list[Any]: ...
    def error(self, message: str) -> list[Any]: ...


class TranslatedWriter:
    """A StreamWriter over a translator: after the stream ends or breaks, it stays silent."""

    def __init__(self, stream: TranslatedStream, encode: Callable[[list[Any]], bytes]) -> None:
        self.stream = stream
        self._encode = encode
        self._closed = False

    def feed(self, chunk: dict[str, Any]) -> bytes:
        return b"" if self._closed else self._encode(self.stream.feed(chunk))

    def end(self) -> bytes:
        return self._close(self.stream.finish)

    def broken(self, message: str) -> bytes:
        return self._close(lambda: self.stream.error(message))

    def upstream_error(self, event: bytes, message: str) -> bytes:
        return self.broken(message)

    def _close(self, closing: Callable[[], list[Any]]) -> bytes:
        if self._closed:
            return b""
        self._closed = True
        return self._encode(closing())
