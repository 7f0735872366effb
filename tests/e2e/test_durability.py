"""Nothing the proxy accepted is lost: database outages and restarts, on real PostgreSQL."""

from __future__ import annotations

import asyncio

import openai
import pytest

from store import db
from tests.support.records import count_calls, export
from tests.support.tcp_gate import through_gate

pytestmark = [pytest.mark.vllm, pytest.mark.postgres]


async def burst(base_url: str, model: str, prefix: str, n: int, concurrency: int = 16) -> None:
    limit = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as api:

        async def one(i: int) -> None:
            async with limit:
                await api.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"{prefix} {i}"}],
                    max_tokens=2,
                )

        await asyncio.gather(*(one(i) for i in range(n)))


def test_database_outage_during_burst_loses_nothing(vllm, pg_url, start_proxy):
    db.upgrade(pg_url)
    gated_url, gate = through_gate(pg_url)
    gate.open()
    proxy = start_proxy([vllm.url], gated_url)
    base = proxy.url + "/v1"
    asyncio.run(burst(base, vllm.model_name, "before", 60))
    proxy.wait_for(lambda h: h["recording"]["written"] == 60, "first 60 written")
    gate.shut()
    asyncio.run(burst(base, vllm.model_name, "during", 80))
    health = proxy.wait_for(
        lambda h: h["recording"]["database"] == "unreachable", "the writer sees the outage"
    )
    assert health["recording"]["backlog_calls"] == 80  # answered, waiting in the call log
    assert health["recording"]["backlog_bytes"] > 0
    assert health["recording"]["queue_depth"] <= health["recording"]["queue_limit_calls"]
    gate.open()
    asyncio.run(burst(base, vllm.model_name, "after", 60))
    health = proxy.wait_for(
        lambda h: h["recording"]["written"] >= 200 and h["recording"]["backlog_calls"] == 0,
        "backlog written",
    )
    assert health["recording"]["queue_depth"] == 0
    engine = db.make_engine(pg_url)
    try:
        assert count_calls(engine) == 200
        prompts = {
            c["request"]["messages"][0]["content"] for t in export(engine) for c in t["calls"]
        }
        expected = {
            f"{p} {i}" for p, n in (("before", 60), ("during", 80), ("after", 60)) for i in range(n)
        }
        assert prompts == expected
    finally:
        engine.dispose()
        gate.shut()


@pytest.mark.parametrize("stop", ["graceful", "kill"])
def test_restart_with_a_backlog_loses_nothing(vllm, pg_url, start_proxy, tmp_path, stop):
    db.upgrade(pg_url)
    gated_url, _gate = through_gate(pg_url)  # never opened: the database is unreachable
    spool = tmp_path / "spool.jsonl"
    proxy = start_proxy([vllm.url], gated_url, spool=spool)
    asyncio.run(burst(proxy.url + "/v1", vllm.model_name, "logged", 30))
    assert proxy.health()["recording"]["backlog_calls"] == 30
    if stop == "graceful":
        proxy.stop()
    else:
        proxy.kill()  # each call's line reached the OS before its answer ended
    restarted = start_proxy([vllm.url], pg_url, spool=spool)
    health = restarted.wait_for(
        lambda h: h["recording"]["backlog_calls"] == 0, "the log written on start"
    )
    assert health["recording"]["written"] == 30
    engine = db.make_engine(pg_url)
    try:
        assert count_calls(engine) == 30
        assert all(len(t["calls"]) == 1 for t in export(engine))
    finally:
        engine.dispose()
