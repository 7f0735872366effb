"""The client APIs' dialects (proxy/generation/dialect.py says what one is): the OpenAI
dialect passes bodies through; the Responses, Messages and Gemini ones translate to chat
over `TranslatedWriter`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from starlette.responses import Response

from proxy.api.translate.shapes import ChatChunk
from proxy.base.capture import CHAT, ChunkFilter, ClientAsked, strip_response
from proxy.base.errors import ProxyError, error_response, sse_error_event
from proxy.base.record import CallRecord
from proxy.base.requests import check_generation
from proxy.generation.dialect import StreamWriter
from proxy.state import ProxyState
from store.json_types import JsonObject


def encode_sse(chunks: list[JsonObject]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)


class OpenAIStream:
    def __init__(self, api: str, asked: ClientAsked) -> None:
        self._filter = ChunkFilter(api, asked)

    def feed(self, chunk: JsonObject) -> bytes:
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
    """Chat completions and completions: bodies pass through (open JSON: what the client sent
    and vLLM answered, fields we do not know included); vLLM's errors unchanged."""

    output_limit = None  # vLLM's own API: its clients get its own answer to a limit

    def __init__(self, api: str, upstream_path: str) -> None:
        self.api = api
        self.capture_api = api
        self.upstream_path = upstream_path

    async def to_upstream(
        self, body: JsonObject, state: ProxyState, record: CallRecord
    ) -> JsonObject:
        check_generation(self.api, body)
        if self.api == CHAT:
            record.chat_messages = body["messages"]
        return body

    def error(self, exc: ProxyError) -> Response:
        return error_response(exc)

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response:
        return Response(raw, status_code=status, media_type=content_type)

    def whole(self, data: JsonObject, asked: ClientAsked, record: CallRecord) -> Any:
        strip_response(self.api, data, asked)
        return data

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter:
        return OpenAIStream(self.api, asked)

    def streamed(self, assembled: JsonObject, writer: StreamWriter, record: CallRecord) -> Any:
        return assembled


class TranslatedStream(Protocol):
    """A pure translator of upstream chat chunks into another API's stream events."""

    def feed(self, chunk: ChatChunk) -> list[Any]: ...
    def finish(self) -> list[Any]: ...
    def error(self, message: str) -> list[Any]: ...


class TranslatedWriter:
    """A StreamWriter over a translator: after the stream ends or breaks, it stays silent."""

    def __init__(self, stream: TranslatedStream, encode: Callable[[list[Any]], bytes]) -> None:
        self.stream = stream
        self._encode = encode
        self._closed = False

    def feed(self, chunk: JsonObject) -> bytes:
        # a StreamWriter takes the upstream's JSON; a translated API's upstream is vLLM's
        # chat endpoint, so the chunk is a chat chunk
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
