"""Reading and checking client request bodies (size, JSON, shape) before anything else."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from starlette.requests import Request

from proxy.base.capture import CHAT, COMPLETIONS
from proxy.base.errors import BadRequest
from store.json_types import JsonObject

SESSION_HEADER = "x-onthejob-session"
TASK_HEADER = "x-onthejob-task"
MAX_SESSION_KEY = 200


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (400) anything over `limit` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> BadRequest:
    return BadRequest(f"request body is larger than {limit} bytes", code="request_too_large")


def parse_object(raw: bytes) -> JsonObject:
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest(
            f"request body must be a JSON object, not {type(body).__name__}", code="invalid_body"
        )
    return body


def check_generation(api: str, body: JsonObject) -> None:
    """The few checks the proxy needs itself; vLLM validates the rest and its 4xx pass through."""
    if api == CHAT:
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("'messages' is required", param="messages", code="missing_required")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(
                "'messages' must be a non-empty array", param="messages", code="invalid_type"
            )
    elif api == COMPLETIONS and body.get("prompt") is None:
        raise BadRequest("'prompt' is required", param="prompt", code="missing_required")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream", code="invalid_type")


def session_key(request: Request) -> str | None:
    """From the URL prefix /s/<key>/v1 or the X-Onthejob-Session header."""
    key = request.path_params.get("session") or request.headers.get(SESSION_HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_SESSION_KEY or not key.isprintable():
        raise BadRequest(
            f"session key must be 1-{MAX_SESSION_KEY} printable characters", code="invalid_session"
        )
    return key


def conversation_key(session: str | None, api: str, body: JsonObject) -> str | None:
    """What every call of one conversation shares: its session (`s:<key>`), else its
    opening: the messages up to and including the first user message (the system prompt
    and the first question), which every later call of an implicit trajectory repeats; a
    text completion's opening is its prompt. None: neither (no user message).

    It keeps a conversation on one replica (its prefix cache) and in one canary arm. The
    first two messages were the key once: without a system prompt they hold the first
    reply, which the first call does not, so a conversation's second call moved."""
    if session is not None:
        return "s:" + session
    opening = _opening(body.get("messages")) if api == CHAT else body.get("prompt")
    if opening is None:
        return None
    try:
        return "m:" + hashlib.blake2b(orjson.dumps(opening), digest_size=12).hexdigest()
    except TypeError:  # not JSON (cannot come from a parsed body; kept safe)
        return None


def _opening(messages: Any) -> list[Any] | None:
    if not isinstance(messages, list):
        return None
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: index + 1]
    return None


def task_key(request: Request) -> str | None:
    """Explicit task key from the X-Onthejob-Task header (what makes runs comparable)."""
    key = request.headers.get(TASK_HEADER)
    if key is None:
        return None
    if not key or len(key) > 500 or not key.isprintable():
        raise BadRequest("task key must be 1-500 printable characters", code="invalid_task")
    return key
