"""A replica that failed is taken out, and gets its conversations back once it answers again.

The replicas are the fake vLLM (tests/support/fake_vllm.py), taken down and brought back:
what is tested is the proxy's routing, and a real engine cannot be brought back on its port
quickly. The app runs in-process (tests/support/inprocess.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine

from tests.support.fake_vllm import ANSWER, FakeVLLM
from tests.support.inprocess import BASE, in_process_client, wait_for_health
from tests.support.records import all_calls, export, wait_for_calls

SESSIONS = [f"agent-{i}" for i in range(16)]


@contextmanager
def proxy_to(upstreams: list[str], db_url: str, tmp_path: Path, **extra: Any) -> Iterator[Any]:
    settings = {"upstreams": upstreams, "database_url": db_url, "upstream_retry_after": 0.2}
    with in_process_client(spool_path=tmp_path / "spool.jsonl", **settings, **extra) as proxy:
        yield proxy


def sdk(proxy: httpx.Client, session: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{BASE}/s/{session}/v1", api_key="x", max_retries=0, http_client=proxy
    )


def ask(proxy: httpx.Client, session: str, text: str) -> None:
    api = sdk(proxy, session)
    reply = api.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": text}], timeout=20
    )
    assert reply.choices[0].message.content == ANSWER  # never a failed client call


def served_by(engine: Engine, text: str) -> dict[str, str]:
    """session -> the upstream that answered its call asking `text`."""
    return {
        t["session"]: c["upstream"]
        for t in export(engine)
        for c in t["calls"]
        if c["request"]["messages"][0]["content"] == text
    }


def upstream_healthy(health: dict[str, Any], url: str) -> bool:
    return next(u["healthy"] for u in health["upstreams"] if u["url"] == url)


def test_a_replica_that_comes_back_is_used_again(db_url: str, engine: Engine, tmp_path: Path):
    with (
        FakeVLLM() as first,
        FakeVLLM() as second,
        proxy_to([first.url, second.url], db_url, tmp_path) as proxy,
    ):
        for session in SESSIONS:
            ask(proxy, session, "before")
        wait_for_calls(engine, len(SESSIONS))
        before = served_by(engine, "before")
        moved = [s for s in SESSIONS if before[s] == second.url]
        assert moved and len(moved) < len(SESSIONS)  # both replicas serve

        second.down()
        for session in moved:
            ask(proxy, session, "while down")
        wait_for_health(proxy, lambda h: not upstream_healthy(h, second.url), "second out")

        second.up()
        # the proxy's own re-check (a /health probe after the back-off) takes it back
        wait_for_health(proxy, lambda h: upstream_healthy(h, second.url), "second back", 20)
        for session in moved:
            ask(proxy, session, "after")

        wait_for_calls(engine, len(SESSIONS) + 2 * len(moved))
    while_down, after = served_by(engine, "while down"), served_by(engine, "after")
    assert set(while_down) == set(after) == set(moved)
    assert set(while_down.values()) == {first.url}  # routed around
    assert set(after.values()) == {second.url}  # and back home
    assert {c["status"] for c in all_calls(engine)} == {"ok"}


def test_a_replica_back_from_a_failure_is_asked_its_sampling_before_it_answers(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """A failed replica's sampling defaults are forgotten (it may come back restarted with
    others). Its first call after it is back must not be recorded without them, which would
    make the call untrainable: the proxy asks before it sends, not at its next poll."""
    # the background poll only at start: what the proxy knows later, it asked itself
    with (
        FakeVLLM() as replica,
        proxy_to([replica.url], db_url, tmp_path, policy_poll_interval=3600) as proxy,
    ):
        known = wait_for_health(proxy, lambda h: h["upstreams"][0]["sampling_defaults"], "ask")
        ask(proxy, "before", "before")

        replica.down()
        api = sdk(proxy, "down")
        with pytest.raises(openai.APIStatusError):
            api.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "down"}], timeout=20
            )
        out = proxy.get("/healthz").json()["upstreams"][0]
        assert not out["healthy"] and out["sampling_defaults"] is None  # forgotten

        replica.up()
        ask(proxy, "after", "after")  # at once: no poll has seen it back
        wait_for_calls(engine, 3)
    sampling = {
        c["request"]["messages"][0]["content"]: c["sampling"]
        for c in all_calls(engine)
        if c["status"] == "ok"
    }
    assert sampling["after"] is not None and sampling["after"] == sampling["before"], sampling
    assert known["upstreams"][0]["sampling_defaults"]["temperature"] == 1.0
