"""A connection the upstream drops before answering is tried once more, on a fresh one.

The case this covers is a kept-alive connection the server closes just as the proxy sends
on it (uvicorn, vLLM's server, closes idle ones after 5 s). The engine cannot be made to do
that on demand, so a small aiohttp server drops the connection when told to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.support.inprocess import in_process_client
from tests.support.threaded_upstream import ThreadedUpstream

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class DroppingUpstream(ThreadedUpstream):
    """Drops the connection of the first ``drops`` chat requests, answers the rest."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.requests = 0
        super().__init__()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        if self.requests <= self.drops:
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        return web.json_response(ANSWER)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": "v0"})

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/weight_info", self._ok)


@pytest.fixture
def dropping(request: pytest.FixtureRequest) -> Iterator[DroppingUpstream]:
    with DroppingUpstream(request.param) as upstream:
        yield upstream


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def proxy_to(upstream: str, tmp_path: Path) -> AbstractContextManager[httpx.Client]:
    """The app in-process (tests/support/inprocess.py) in front of `upstream`."""
    return in_process_client(
        upstreams=[upstream],
        database_url=f"sqlite:///{tmp_path / 'r.db'}",
        spool_path=tmp_path / "spool.jsonl",
    )


@pytest.mark.parametrize("dropping", [1], indirect=True)
def test_one_dropped_connection_is_retried_unseen(dropping, tmp_path):
    with proxy_to(dropping.url, tmp_path) as proxy:
        answer = proxy.post("/v1/chat/completions", json=BODY)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "hello"
    assert dropping.requests == 2


@pytest.mark.parametrize("dropping", [100], indirect=True)
def test_a_replica_that_keeps_dropping_is_a_502_naming_it(dropping, tmp_path):
    with proxy_to(dropping.url, tmp_path) as proxy:
        answer = proxy.post("/v1/chat/completions", json=BODY)
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert dropping.url in message and "dropped the connection" in message
    assert dropping.requests == 2  # once more, not forever
