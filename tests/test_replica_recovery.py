"""A replica that failed is taken out, and gets its conversations back once it answers again.

The replicas are bench/fake_upstream's constant-answer server (tests/fake_replica.py): what is
tested is the proxy's routing, and a real engine cannot be brought back on its port quickly.
"""

from __future__ import annotations

from typing import Any

import openai
from sqlalchemy import Engine

from bench.fake_upstream import WORDS
from tests.fake_replica import FakeReplica
from tests.records import all_calls, export, wait_for_calls

SESSIONS = [f"agent-{i}" for i in range(16)]


def ask(proxy_url: str, session: str, text: str) -> None:
    api = openai.OpenAI(base_url=f"{proxy_url}/s/{session}/v1", api_key="x", max_retries=0)
    reply = api.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": text}], timeout=20
    )
    assert reply.choices[0].message.content == "".join(WORDS)  # never a failed client call


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


def test_a_replica_that_comes_back_is_used_again(db_url: str, engine: Engine, start_proxy):
    with FakeReplica() as first, FakeReplica() as second:
        proxy = start_proxy([first.url, second.url], db_url, args=["--upstream-retry-after", "0.2"])
        for session in SESSIONS:
            ask(proxy.url, session, "before")
        wait_for_calls(engine, len(SESSIONS))
        before = served_by(engine, "before")
        moved = [s for s in SESSIONS if before[s] == second.url]
        assert moved and len(moved) < len(SESSIONS)  # both replicas serve

        second.down()
        for session in moved:
            ask(proxy.url, session, "while down")
        proxy.wait_for(lambda h: not upstream_healthy(h, second.url), "second replica out")

        second.up()
        # the proxy's own re-check (a /health probe after the back-off) takes it back
        proxy.wait_for(lambda h: upstream_healthy(h, second.url), "second replica back", 20)
        for session in moved:
            ask(proxy.url, session, "after")

        wait_for_calls(engine, len(SESSIONS) + 2 * len(moved))
    while_down, after = served_by(engine, "while down"), served_by(engine, "after")
    assert set(while_down) == set(after) == set(moved)
    assert set(while_down.values()) == {first.url}  # routed around
    assert set(after.values()) == {second.url}  # and back home
    assert {c["status"] for c in all_calls(engine)} == {"ok"}
