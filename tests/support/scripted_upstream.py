"""An OpenAI-style upstream whose stream the test scripts step by step.

For properties the real engine cannot show on demand: that the proxy relays a chunk before
the upstream has sent the next one, and what the client sees when an upstream breaks off
mid-answer. Everything else is tested against the real vLLM server.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
from aiohttp import web

from learner.vllm_server import free_port


def chunk(content: str, *, token_id: int, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "delta": {"content": content},
                "logprobs": {
                    "content": [
                        {"token": content, "logprob": -0.5, "bytes": [], "top_logprobs": []}
                    ]
                },
                "finish_reason": finish,
                "token_ids": [token_id],
            }
        ],
    }


class ScriptedUpstream:
    """Streams `before`, waits until `release()` (or breaks off if `break_after`), then the rest."""

    def __init__(
        self,
        before: list[dict[str, Any]],
        after: list[dict[str, Any]],
        *,
        break_after: bool = False,
    ) -> None:
        self.before, self.after, self.break_after = before, after, break_after
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._gate = threading.Event()
        self.hung_up = threading.Event()  # the proxy closed the upstream connection early
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def release(self) -> None:
        self._gate.set()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for item in self.before:
            await response.write(b"data: " + orjson.dumps(item) + b"\n\n")
        if self.break_after:
            assert request.transport is not None
            request.transport.abort()  # the replica dies mid-answer
            return response
        # hold the answer until released, noticing if the proxy hangs up meanwhile
        deadline = asyncio.get_running_loop().time() + 30
        while not self._gate.is_set() and asyncio.get_running_loop().time() < deadline:
            transport = request.transport
            if transport is None or transport.is_closing():
                self.hung_up.set()
                return response
            await asyncio.sleep(0.01)
        for item in self.after:
            await response.write(b"data: " + orjson.dumps(item) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._gate.set()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
