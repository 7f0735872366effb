"""The load drill: PostgreSQL slowed, or stopped, while the proxy is under load; then the proxy
is killed with SIGKILL and restarted; every call answered before the kill must be in the
database, once.

The upstream is the fake vLLM (tests/support/fake_vllm.py), answering its constant answer: the
drill is about the recording path at a load vLLM-CPU cannot produce on this machine. The same
faults against the real vLLM server are in tests/e2e/test_durability.py. PostgreSQL is the shared
server, made slow or unreachable through a TCP gate in front of it, never stopped itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import openai
import pytest

from learner.proxy_process import ProxyServer
from store import db
from tests.support.fake_vllm import FakeVLLM
from tests.support.records import export
from tests.support.tcp_gate import TcpGate, through_gate

pytestmark = [pytest.mark.postgres]

CONCURRENCY = 32


class Load:
    """CONCURRENCY clients sending distinct questions until the proxy stops answering."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.answered: list[str] = []
        self.sent = 0
        self.failed = 0

    async def run(self) -> None:
        async with openai.AsyncOpenAI(
            base_url=self.base_url, api_key="x", max_retries=0, timeout=10
        ) as client:
            await asyncio.gather(*(self._client(client) for _ in range(CONCURRENCY)))

    async def _client(self, client: openai.AsyncOpenAI) -> None:
        while True:
            question = f"drill question {self.sent}"
            self.sent += 1
            try:
                await client.chat.completions.create(
                    model="fake", messages=[{"role": "user", "content": question}], max_tokens=8
                )
            except openai.APIError:  # the proxy was killed: this client is done
                self.failed += 1
                return
            self.answered.append(question)

    async def until_answered(self, n: int, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while len(self.answered) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.answered)} of {n} calls answered")
            await asyncio.sleep(0.01)


async def drill(
    proxy: ProxyServer, gate: TcpGate, fault: str, restart: Callable[[], ProxyServer]
) -> tuple[list[str], ProxyServer]:
    load = Load(proxy.url + "/v1")
    clients = asyncio.create_task(load.run())
    await load.until_answered(300)
    if fault == "slowed":
        gate.delay = 0.2  # every packet to and from PostgreSQL waits 200 ms
    else:
        gate.shut()
    during = len(load.answered)
    await load.until_answered(during + 1500)
    health = await asyncio.to_thread(proxy.health)
    recording = health["recording"]
    assert recording["queue_depth"] <= recording["queue_limit_calls"]
    if fault == "stopped":
        # nothing answered since the database went away can be in it: all in the log
        assert recording["backlog_calls"] >= len(load.answered) - during - CONCURRENCY
    await asyncio.to_thread(proxy.kill)  # SIGKILL, under load
    answered = list(load.answered)  # the proxy is dead: nothing more can be answered
    await clients
    assert load.failed == CONCURRENCY
    gate.delay = 0.0
    return answered, await asyncio.to_thread(restart)


@pytest.mark.parametrize("fault", ["slowed", "stopped"])
def test_kill_under_load_with_the_database_behind_loses_no_answered_call(
    fault: str, fake_vllm: FakeVLLM, pg_url: str, start_proxy: Callable[..., ProxyServer]
) -> None:
    db.upgrade(pg_url)
    gated_url, gate = through_gate(pg_url)
    gate.open()
    proxy = start_proxy([fake_vllm.url], gated_url)

    def restart() -> ProxyServer:
        if fault == "stopped":
            gate.open()
        return start_proxy([fake_vllm.url], gated_url)

    try:
        answered, restarted = asyncio.run(drill(proxy, gate, fault, restart))
        health = restarted.wait_for(
            lambda h: h["recording"]["backlog_calls"] == 0, "the call log written", timeout=120
        )
        assert health["recording"]["rejected"] == 0
        engine = db.make_engine(pg_url)
        try:
            recorded = [
                call["request"]["messages"][0]["content"]
                for trajectory in export(engine)
                for call in trajectory["calls"]
            ]
        finally:
            engine.dispose()
        assert len(recorded) == len(set(recorded)), "a call was written twice"
        missing = set(answered) - set(recorded)
        assert not missing, f"{len(missing)} of {len(answered)} answered calls lost"
    finally:
        gate.shut()
