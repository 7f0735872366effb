"""Errors the proxy answers with, always in the OpenAI error shape.

`{"error": {"message", "type", "param", "code"}}`; a streaming error is an SSE event of that
shape followed by `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
from starlette.responses import Response


class ProxyError(Exception):
    """An error answered to the client; `status` is the HTTP status."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> ErrorBody:
        return error_body(self.message, self.type, param=self.param, code=self.code)


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"


class ServiceUnavailable(ProxyError):
    """Something the proxy needs besides the upstream (e.g. its database) is unreachable."""

    status = 503
    type = "server_error"


class UpstreamUnavailable(ProxyError):
    """No replica could be reached (connection refused, reset before a response)."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamBusy(ProxyError):
    """Every replica is held while its weights are swapped and verified, for too long."""

    status = 503
    type = "upstream_error"
    code = "upstream_busy"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorBody(TypedDict):
    """An OpenAI-style error body."""

    error: ErrorDetail


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | int | None = None
) -> ErrorBody:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: ProxyError) -> Response:
    return Response(orjson.dumps(exc.body()), status_code=exc.status, media_type="application/json")


def sse_error_event(message: str, type_: str = "upstream_error", code: str | None = None) -> bytes:
    payload = orjson.dumps(error_body(message, type_, code=code))
    return b"data: " + payload + b"\n\ndata: [DONE]\n\n"


def json_or_text(raw: bytes) -> Any:
    """An upstream body as JSON, or its (bounded) text when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"text": raw[:65536].decode("utf-8", "replace")}


def upstream_error_message(raw: bytes) -> str:
    """The message of an upstream error body (OpenAI shape or close), else its text."""
    parsed = json_or_text(raw)
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if parsed.get("message"):
            return str(parsed["message"])
    return raw[:2000].decode("utf-8", "replace")
