"""How one client API maps onto an upstream vLLM call: the seam between HTTP and capture.

A Dialect turns the client's body into the upstream request, and the upstream's answer
(whole or streamed) into what this API's clients expect, errors included. Generation calls
through these protocols; the client APIs implement them (proxy/api/dialect.py and routes/).
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.responses import Response

from proxy.base.capture import ClientAsked
from proxy.base.errors import ProxyError
from proxy.base.record import CallRecord
from proxy.state import ProxyState
from store.json_types import JsonObject


class StreamWriter(Protocol):
    """Upstream chunks in, bytes for the client out."""

    def feed(self, chunk: JsonObject) -> bytes: ...
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
        self, body: JsonObject, state: ProxyState, record: CallRecord
    ) -> JsonObject:
        """The upstream request body (before capture flags); raises ProxyError."""
        ...

    def error(self, exc: ProxyError) -> Response: ...

    def upstream_error(self, status: int, raw: bytes, content_type: str) -> Response: ...

    def whole(self, data: JsonObject, asked: ClientAsked, record: CallRecord) -> Any:
        """The client's body from a whole upstream response (already captured)."""
        ...

    def stream(self, asked: ClientAsked, record: CallRecord) -> StreamWriter: ...

    def streamed(self, assembled: JsonObject, writer: StreamWriter, record: CallRecord) -> Any:
        """What the client got from a stream, as one object (the upstream's assembled)."""
        ...
