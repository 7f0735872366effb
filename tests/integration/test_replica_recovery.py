"""A replica that failed is taken out, and gets its conversations back once it answers again.

The replicas are bench/fake_upstream's constant-answer server
(tests/support/fake_replica.py): what is tested is the proxy's routing, and a real engine
cannot be brought back on its port quickly.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from sqlalchemy import Engine

from bench.fake_upstream import WORDS
from tests.support.fake_replica import FakeReplica
from tests.support.records import all_calls, export, wait_for_calls

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


def test_a_replica_back_from_a_failure_is_asked_its_sampling_before_it_answers(
    db_url: str, engine: Engine, start_proxy
) -> None:
    """A failed replica's sampling defaults are forgotten (it may come back restarted with
    others). Its first call after it is back must not be recorded without them, which would
    make the call untrainable: the proxy asks before it sends, not at its next poll."""
    with FakeReplica() as replica:
        # the background poll only at start: what the proxy knows later, it asked itself
        env = {"ONTHEJOB_POLICY_POLL_INTERVAL": "3600"}
        proxy = start_proxy([replica.url], db_url, args=["--upstream-retry-after", "0.2"], env=env)
        known = proxy.wait_for(lambda h: h["upstreams"][0]["sampling_defaults"], "defaults")
        ask(proxy.url, "before", "before")

        replica.down()
        api = openai.OpenAI(base_url=f"{proxy.url}/s/down/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError):
            api.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "down"}], timeout=20
            )
        out = proxy.health()["upstreams"][0]
        assert not out["healthy"] and out["sampling_defaults"] is None  # forgotten

        replica.up()
        ask(proxy.url, "after", "after")  # at once: no poll has seen it back
        wait_for_calls(engine, 3)
    sampling = {
        c["request"]["messages"][0]["content"]: c["sampling"]
        for c in all_calls(engine)
        if c["status"] == "ok"
    }
    assert sampling["after"] is not None and sampling["after"] == sampling["before"], sampling
    assert known["upstreams"][0]["sampling_defaults"]["temperature"] == 1.0
