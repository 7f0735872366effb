"""An OpenAI-style upstream with the vLLM bug the proxy works around: streamed tool calls
whose chunks come without their token ids (the tool parser swallows them), while usage still
counts every sampled token. Whole (non-streaming) answers carry all of them.

The vLLM version the tests run does not have the bug, so it is reproduced here.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from tests.support.threaded_upstream import ThreadedUpstream

PROMPT_IDS = [1, 2, 3, 4]
# <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>
TOKEN_IDS = [201, 202, 203, 204, 205, 206, 207, 208]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0, -0.75, -0.0625, -0.3, -0.2]
ARGUMENTS = '{"a": 1, "b": 2}'
TEXT_IDS = [301, 302]  # an answer without tools: "Hi there"


def _logprobs(ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": f"t{i}", "logprob": lp, "bytes": [], "top_logprobs": []}
            for i, lp in zip(ids, logprobs, strict=True)
        ]
    }


def _usage(completion: int) -> dict[str, int]:
    prompt = len(PROMPT_IDS)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def whole_tool_call() -> dict[str, Any]:
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": ARGUMENTS}}
    return {
        "id": "chatcmpl-whole",
        "object": "chat.completion",
        "created": 1,
        "model": "scripted",
        "prompt_token_ids": PROMPT_IDS,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                "logprobs": _logprobs(TOKEN_IDS, LOGPROBS),
                "finish_reason": "tool_calls",
                "token_ids": TOKEN_IDS,
            }
        ],
        "usage": _usage(len(TOKEN_IDS)),
    }


def _chunk(
    delta: dict[str, Any], ids: list[int] | None, finish: str | None = None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
        choice["logprobs"] = _logprobs(ids, LOGPROBS[: len(ids)])
    return {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "scripted",
        "choices": [choice],
    }


def streamed_tool_call() -> list[dict[str, Any]]:
    """The buggy stream: only the last token's id arrives; usage counts all of them."""
    first = _chunk({"role": "assistant", "content": ""}, None)
    first["prompt_token_ids"] = PROMPT_IDS
    name = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add"}}
    return [
        first,
        _chunk({"tool_calls": [name]}, None),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS}}]}, None),
        _chunk({}, TOKEN_IDS[-1:], finish="tool_calls"),
        {**_chunk({}, None), "choices": [], "usage": _usage(len(TOKEN_IDS))},
    ]


def streamed_text() -> list[dict[str, Any]]:
    first = _chunk({"role": "assistant", "content": ""}, None)
    first["prompt_token_ids"] = PROMPT_IDS
    return [
        first,
        _chunk({"content": "Hi"}, TEXT_IDS[:1]),
        _chunk({"content": " there"}, TEXT_IDS[1:], finish="stop"),
        {**_chunk({}, None), "choices": [], "usage": _usage(len(TEXT_IDS))},
    ]


class ToolDroppingUpstream(ThreadedUpstream):
    """Serves the chat answers above; `requests` holds every chat request body it got."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        super().__init__()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if not body.get("stream"):
            return web.json_response(whole_tool_call())
        chunks = streamed_tool_call() if body.get("tools") else streamed_text()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for item in chunks:
            await response.write(b"data: " + orjson.dumps(item) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "v0"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "parent": None}]})

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/weight_info", self._weight_info)
        app.router.add_get("/v1/models", self._models)
