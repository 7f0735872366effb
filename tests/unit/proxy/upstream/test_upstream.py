"""Replica choice and the headers sent upstream (no network)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.base.errors import UpstreamBusy
from proxy.upstream.replicas import UpstreamPool


def pool(urls: list[str], api_key: str | None = None) -> UpstreamPool:
    return UpstreamPool(urls, connect_timeout=1, total_timeout=1, retry_after=1, api_key=api_key)


def test_client_credentials_reach_vllm_as_a_bearer_token() -> None:
    assert pool(["http://a"]).headers({"authorization": "Bearer k"})["Authorization"] == "Bearer k"
    assert pool(["http://a"]).headers({"x-api-key": "k"})["Authorization"] == "Bearer k"
    assert "Authorization" not in pool(["http://a"]).headers({})
    configured = pool(["http://a"], api_key="mine").headers({"authorization": "Bearer theirs"})
    assert configured["Authorization"] == "Bearer mine"


def test_sticky_order_is_stable_and_failed_replicas_go_last() -> None:
    replicas = pool(["http://a", "http://b", "http://c"])
    first = [r.url for r in replicas.candidates("s:one")]
    assert [r.url for r in replicas.candidates("s:one")] == first
    spread = {replicas.candidates(f"s:{i}")[0].url for i in range(30)}
    assert spread == {"http://a", "http://b", "http://c"}
    replicas.mark_failed(replicas.candidates("s:one")[0])
    after = [r.url for r in replicas.candidates("s:one")]
    assert after[-1] == first[0] and after[:2] == [u for u in first if u != first[0]]
    replicas.mark_ok(next(r for r in replicas.replicas if r.url == first[0]))
    assert [r.url for r in replicas.candidates("s:one")] == first


def test_a_gated_replica_gets_nothing_and_its_sticky_sessions_wait_elsewhere() -> None:
    replicas = pool(["http://a", "http://b", "http://c"])
    first = [r.url for r in replicas.candidates("s:one")]
    gated = next(r for r in replicas.replicas if r.url == first[0])
    replicas.close_gate(gated, epoch=3)
    assert [r.url for r in replicas.candidates("s:one")] == first[1:]  # order kept
    assert replicas.drained_epochs() == {first[0]: 3}  # nothing in flight to it
    gated.in_flight = 1
    assert replicas.drained_epochs() == {}
    replicas.open_gate(gated, "v2")
    assert gated.gate_epoch is None and gated.policy_version == "v2"
    assert [r.url for r in replicas.candidates("s:one")] == first


def test_with_every_replica_gated_a_request_waits_for_one_to_open() -> None:
    replicas = UpstreamPool(
        ["http://a"], connect_timeout=1, total_timeout=1, retry_after=1, gate_wait=0.05
    )
    replica = replicas.replicas[0]
    replicas.close_gate(replica, epoch=1)

    async def wait_then_open() -> list[str]:
        waiting = asyncio.ensure_future(replicas._open_replicas(None))
        await asyncio.sleep(0)
        assert not waiting.done()
        replicas.open_gate(replica, None)
        return [r.url for r in await waiting]

    assert asyncio.run(wait_then_open()) == ["http://a"]
    replicas.close_gate(replica, epoch=2)
    with pytest.raises(UpstreamBusy, match="held for a weight swap"):
        asyncio.run(replicas._open_replicas(None))


def test_preferred_replicas_go_first_and_the_rest_stay_in_order() -> None:
    """A canary's arm to its replicas: preferred ones first, in the sticky order, healthy
    before resting, the others after them (never dropped: a call is answered)."""
    replicas = pool(["http://a", "http://b", "http://c", "http://d"])
    first = [r.url for r in replicas.candidates("s:one")]
    candidate = {first[1], first[3]}
    ordered = [r.url for r in replicas.candidates("s:one", lambda r: r.url in candidate)]
    assert ordered == [first[1], first[3], first[0], first[2]]
    replicas.mark_failed(next(r for r in replicas.replicas if r.url == first[1]))
    ordered = [r.url for r in replicas.candidates("s:one", lambda r: r.url in candidate)]
    assert ordered == [first[3], first[0], first[2], first[1]]
    assert [r.url for r in replicas.candidates("s:one", lambda r: False)] == [
        u for u in first if u != first[1]
    ] + [first[1]]
