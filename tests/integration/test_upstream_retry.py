"""A connection the upstream drops before answering is tried once more, on a fresh one.

The case this covers is a kept-alive connection the server closes just as the proxy sends
on it (uvicorn, vLLM's server, closes idle ones after 5 s). The engine cannot be made to do
that on demand, so the fake vLLM (tests/support/fake_vllm.py) drops the connection when told to.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest

from tests.support.fake_vllm import ANSWER, DROP, FakeVLLM
from tests.support.inprocess import in_process_client


@pytest.fixture
def dropping(request: pytest.FixtureRequest) -> Iterator[FakeVLLM]:
    """Drops the connection of the first `request.param` chat requests, answers the rest."""
    with FakeVLLM() as upstream:
        upstream.reply = lambda _: DROP if len(upstream.requests) <= request.param else None
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
    assert answer.json()["choices"][0]["message"]["content"] == ANSWER
    assert len(dropping.requests) == 2


@pytest.mark.parametrize("dropping", [100], indirect=True)
def test_a_replica_that_keeps_dropping_is_a_502_naming_it(dropping, tmp_path):
    with proxy_to(dropping.url, tmp_path) as proxy:
        answer = proxy.post("/v1/chat/completions", json=BODY)
    assert answer.status_code == 502
    message = answer.json()["error"]["message"]
    assert dropping.url in message and "dropped the connection" in message
    assert len(dropping.requests) == 2  # once more, not forever
