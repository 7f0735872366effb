"""Canaries through the admin API and the proxy in-process, on SQLite and PostgreSQL: a share
of a scope's sessions goes to the candidate, sticky per session (an implicit trajectory by
its opening), where a replica has it loaded, else to the incumbent, and the record names the
version that answered; decisions are recorded with who took them; a rollback leaves what
serves untouched; the endpoints need the admin token and answer errors in the API's shape."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, select

from proxy.upstream.canary_assignment import in_candidate_arm
from store.models import Call
from tests.support.adapter_proxy import adapters_read, admin, settings
from tests.support.fake_vllm import FakeVLLM
from tests.support.inprocess import InProcessProxy, in_process_proxy
from tests.support.records import wait_for_calls

SUPPORT = {"X-Onthejob-Type": "support"}  # the tenant's calls


async def ask(
    proxy: InProcessProxy, session: str | None, messages: list[dict[str, str]], **headers: str
) -> None:
    path = f"/s/{session}/v1/chat/completions" if session else "/v1/chat/completions"
    answer = await proxy.http.post(
        path, json={"model": "fake", "messages": messages}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "fake"  # the client sees the model it asked for


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def load(proxy: InProcessProxy, fake_vllm: FakeVLLM, adapters: list[str]) -> None:
    """The replica has exactly `adapters` loaded, and the proxy has read so."""
    fake_vllm.adapters[:] = adapters
    await adapters_read(proxy, set(adapters))


async def tenant_serving(proxy: InProcessProxy, version: str) -> None:
    """Tenant `team` (the calls of type support), its calls pointed at `version`."""
    made = await admin(proxy, "PUT", "/tenants/team", json={"interaction_types": ["support"]})
    assert made.status_code == 201, made.text
    pointed = await admin(proxy, "PUT", "/tenants/team/serving", json={"version": version})
    assert pointed.status_code == 200, pointed.text


def versions_by(engine: Engine, n: int, column: Any) -> dict[Any, set[str | None]]:
    wait_for_calls(engine, n)
    found: dict[Any, set[str | None]] = defaultdict(set)
    with engine.connect() as conn:
        for key, version in conn.execute(select(column, Call.policy_version)):
            found[key].add(version)
    return found


def test_a_share_of_sessions_goes_to_the_candidate_and_stays_there(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    sessions = [f"s{i}" for i in range(200)]

    async def scenario() -> dict[str, Any]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            await tenant_serving(proxy, "team-1")
            await load(proxy, fake_vllm, ["team-1", "team-2"])
            started = await admin(
                proxy, "POST", "/canaries",
                json={"tenant": "team", "candidate": "team-2", "share": 0.3, "by": "alice"},
            )  # fmt: skip
            assert started.status_code == 201, started.text
            for session in sessions:
                await ask(proxy, session, user("first"), **SUPPORT)
            for session in sessions[:50]:  # their second turn: the same arm
                await ask(proxy, session, user("second"), **SUPPORT)
            for k in range(20):  # implicit trajectories: assigned by their opening
                opening = user(f"question {k}")
                await ask(proxy, None, opening, **SUPPORT)
                reply = {"role": "assistant", "content": "The answer is forty-two."}
                await ask(proxy, None, [*opening, reply, *user("and then?")], **SUPPORT)
            await ask(proxy, "shared", user("nobody's"))  # no canary for the shared policy
            # the candidate unloaded (a replica restarted): its sessions go to the incumbent
            await load(proxy, fake_vllm, ["team-1"])
            for session in sessions[:20]:
                await ask(proxy, session, user("third"), **SUPPORT)
            return started.json()

    canary = asyncio.run(scenario())
    assert canary["tenant"] == "team" and canary["incumbent"] == "team-1"
    assert canary["loaded_on"] == [fake_vllm.url] and canary["started_by"] == "admin:alice"
    by_session = versions_by(engine, 200 + 50 + 40 + 1 + 20, Call.session_key)
    assert by_session.pop("shared") == {"fake-v1"}
    unloaded = {s for s in sessions[:20]}
    # sticky: every session was answered by one version while the candidate was loaded
    for session in sessions:
        got = by_session[session] - ({"team-1"} if session in unloaded else set())
        assert len(got) == 1 or got == set(), (session, by_session[session])
    candidate_arm = {s for s in sessions if in_candidate_arm(canary["id"], "s:" + s, 0.3)}
    assert {s for s in sessions if "team-2" in by_session[s]} == candidate_arm
    assert abs(len(candidate_arm) / len(sessions) - 0.3) < 0.13  # 4 standard deviations
    # without the candidate loaded, its arm's calls were answered (and recorded) by team-1
    assert all("team-1" in by_session[s] for s in unloaded)
    assert sum(r["model"] == "team-2" for r in fake_vllm.requests[-20:]) == 0
    with engine.connect() as conn:
        unnamed = conn.execute(
            select(Call.request, Call.policy_version).where(Call.session_key.is_(None))
        ).all()
    by_opening: dict[str, set[str | None]] = defaultdict(set)
    for request, version in unnamed:
        by_opening[request["messages"][0]["content"]].add(version)
    assert len(by_opening) == 20 and all(len(v) == 1 for v in by_opening.values())
    assert {v for versions in by_opening.values() for v in versions} == {"team-1", "team-2"}


def test_decisions_are_recorded_with_who_took_them(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            await tenant_serving(proxy, "team-1")
            await load(proxy, fake_vllm, ["team-1", "team-2", "team-3"])
            first = (
                await admin(
                    proxy, "POST", "/canaries",
                    json={"tenant": "team", "candidate": "team-2", "share": 0.5},
                )
            ).json()  # fmt: skip
            out["extended"] = await admin(
                proxy, "POST", f"/canaries/{first['id']}/extend",
                json={"seconds": 3600, "by": "bob", "reason": "quiet weekend"},
            )  # fmt: skip
            out["rolled back"] = await admin(
                proxy, "POST", f"/canaries/{first['id']}/rollback",
                json={"by": "carol", "reason": "more corrections"},
            )  # fmt: skip
            out["tenant after rollback"] = (await admin(proxy, "GET", "/tenants/team")).json()
            for k in range(10):  # every session back on the incumbent
                await ask(proxy, f"after-rollback-{k}", user("hi"), **SUPPORT)
            second = (
                await admin(
                    proxy, "POST", "/canaries",
                    json={"tenant": "team", "candidate": "team-3", "share": 0.5},
                )
            ).json()  # fmt: skip
            out["promoted"] = await admin(proxy, "POST", f"/canaries/{second['id']}/promote")
            out["tenant after promotion"] = (await admin(proxy, "GET", "/tenants/team")).json()
            for k in range(10):  # every session on the promoted candidate
                await ask(proxy, f"after-promotion-{k}", user("hi"), **SUPPORT)
            out["listed"] = (await admin(proxy, "GET", "/canaries")).json()["items"]
            out["running"] = (await admin(proxy, "GET", "/canaries?status=running")).json()
            out["newest"] = (await admin(proxy, "GET", "/canaries?limit=1")).json()["items"]
            return out

    out = asyncio.run(scenario())
    assert out["extended"].status_code == 200, out["extended"].text
    rolled = out["rolled back"].json()
    assert rolled["status"] == "rolled_back" and rolled["decided_by"] == "admin:carol"
    assert rolled["reason"] == "more corrections"
    assert [(a["action"], a["by"], a["reason"]) for a in rolled["actions"]] == [
        ("start", "admin", ""),
        ("extend", "admin:bob", "quiet weekend"),
        ("rollback", "admin:carol", "more corrections"),
    ]
    # the rollback left the tenant's serving version as it was
    assert out["tenant after rollback"]["serving_version"] == "team-1"
    promoted = out["promoted"].json()
    assert promoted["status"] == "promoted" and promoted["decided_by"] == "admin"
    assert out["tenant after promotion"]["serving_version"] == "team-3"
    assert [c["status"] for c in out["listed"]] == ["promoted", "rolled_back"]
    assert out["running"]["items"] == []
    assert [c["id"] for c in out["newest"]] == [promoted["id"]]
    wait_for_calls(engine, 20)
    with engine.connect() as conn:
        rows = conn.execute(select(Call.session_key, Call.policy_version)).all()
    assert {v for s, v in rows if s.startswith("after-rollback")} == {"team-1"}
    assert {v for s, v in rows if s.startswith("after-promotion")} == {"team-3"}
    # the arms' stats: the first canary's arms served nothing of its own before its rollback
    first = out["listed"][1]
    assert first["arms"]["candidate"]["version"] == "team-2"
    assert first["arms"]["candidate"]["calls"] == 0


def test_the_shared_policys_candidate_answers_its_share_of_the_calls_of_no_tenant(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def scenario() -> tuple[dict[str, Any], httpx.Response, dict[str, Any]]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            started = await admin(
                proxy, "POST", "/canaries", json={"candidate": "base-lora-2", "share": 0.5}
            )
            assert started.status_code == 201, started.text
            # the proxy reads the replicas' adapters once one is wanted: the candidate now
            await load(proxy, fake_vllm, ["base-lora-2"])
            for k in range(40):
                await ask(proxy, f"s{k}", user("hi"))
            await asyncio.to_thread(wait_for_calls, engine, 40)  # for the arms' stats
            canary = started.json()
            # not a recorded version: the swap that would serve it everywhere is refused,
            # and the canary runs on
            refused = await admin(proxy, "POST", f"/canaries/{canary['id']}/promote")
            after = (await admin(proxy, "GET", f"/canaries/{canary['id']}")).json()
            return canary, refused, after

    canary, refused, after = asyncio.run(scenario())
    assert canary["tenant"] is None and canary["incumbent"] == "fake-v1"  # as reported
    by_session = versions_by(engine, 40, Call.session_key)
    expected = {
        f"s{k}": {"base-lora-2" if in_candidate_arm(canary["id"], f"s:s{k}", 0.5) else "fake-v1"}
        for k in range(40)
    }
    assert by_session == expected
    assert refused.status_code == 404 and "no policy version 'base-lora-2'" in refused.text
    assert after["status"] == "running"
    calls = {arm: after["arms"][arm]["calls"] for arm in ("candidate", "incumbent")}
    assert calls == {
        "candidate": sum(v == {"base-lora-2"} for v in expected.values()),
        "incumbent": sum(v == {"fake-v1"} for v in expected.values()),
    }


def test_the_canary_api_needs_the_token_and_answers_errors_in_its_shape(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def scenario() -> dict[str, httpx.Response]:
        out: dict[str, httpx.Response] = {}
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            for method, path in (
                ("GET", "/canaries"),
                ("GET", "/canaries/1"),
                ("POST", "/canaries"),
                ("POST", "/canaries/1/promote"),
                ("POST", "/canaries/1/rollback"),
                ("POST", "/canaries/1/extend"),
            ):
                out[f"no token {method} {path}"] = await proxy.http.request(
                    method, "/admin/api" + path, json={}
                )
            await admin(proxy, "PUT", "/tenants/team", json={"interaction_types": ["support"]})
            body = {"tenant": "team", "candidate": "team-2"}
            out["started"] = await admin(proxy, "POST", "/canaries", json=body)
            out["second in scope"] = await admin(proxy, "POST", "/canaries", json=body)
            out["unknown tenant"] = await admin(
                proxy, "POST", "/canaries", json={**body, "tenant": "nobody"}
            )
            out["share of 1"] = await admin(proxy, "POST", "/canaries", json={**body, "share": 1})
            out["extra field"] = await admin(proxy, "POST", "/canaries", json={**body, "arms": 3})
            out["bad operator"] = await admin(
                proxy, "POST", "/canaries/1/rollback", json={"by": "no spaces"}
            )
            out["unknown canary"] = await admin(proxy, "POST", "/canaries/999/rollback")
            out["huge id"] = await admin(proxy, "GET", "/canaries/99999999999999")
            out["no seconds"] = await admin(proxy, "POST", "/canaries/1/extend", json={})
            out["rolled back"] = await admin(proxy, "POST", "/canaries/1/rollback")
            out["twice"] = await admin(proxy, "POST", "/canaries/1/promote")
            out["extend decided"] = await admin(
                proxy, "POST", "/canaries/1/extend", json={"seconds": 60}
            )
        return out

    out = asyncio.run(scenario())
    for case, answer in out.items():
        assert answer.status_code < 500, (case, answer.text)
        if answer.status_code >= 400:
            error = answer.json()["error"]
            assert error["message"] and error["type"], case
    assert {k: r.status_code for k, r in out.items() if k.startswith("no token")} == {
        k: 401 for k in out if k.startswith("no token")
    }
    assert out["started"].status_code == 201
    assert out["started"].json()["incumbent"] == "fake-v1"  # the tenant rides on the shared
    assert out["second in scope"].status_code == 409
    assert "runs for tenant 'team' already" in out["second in scope"].text
    assert out["unknown tenant"].status_code == 404
    for case in ("share of 1", "extra field", "bad operator", "huge id", "no seconds"):
        assert out[case].status_code == 400, (case, out[case].text)
    assert out["unknown canary"].status_code == 404
    assert out["rolled back"].status_code == 200
    assert out["twice"].status_code == 409 and "rolled_back already" in out["twice"].text
    assert out["extend decided"].status_code == 409


def test_a_full_weight_candidate_answers_its_arm_from_the_replicas_that_serve_it(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """The shared policy's candidate is full weights on one replica of two (its policy
    version there): its arm's sessions are answered by that replica, every other session by
    the incumbent's, each recorded as the version that answered it."""
    with FakeVLLM(version="step-9") as candidate_replica:

        async def scenario() -> dict[str, Any]:
            options = settings(fake_vllm, db_url, tmp_path)
            options["upstreams"] = [fake_vllm.url, candidate_replica.url]
            async with in_process_proxy(**options) as proxy:
                started = await admin(
                    proxy, "POST", "/canaries", json={"candidate": "step-9", "share": 0.5}
                )
                assert started.status_code == 201, started.text
                for k in range(40):
                    await ask(proxy, f"s{k}", user("hi"))
                return started.json()

        canary = asyncio.run(scenario())
    wait_for_calls(engine, 40)
    with engine.connect() as conn:
        rows = conn.execute(select(Call.session_key, Call.policy_version, Call.upstream)).all()
    arm = {f"s{k}": in_candidate_arm(canary["id"], f"s:s{k}", 0.5) for k in range(40)}
    assert 0 < sum(arm.values()) < 40
    for session, version, upstream in rows:
        if arm[session]:
            assert (version, upstream) == ("step-9", candidate_replica.url), session
        else:
            assert (version, upstream) == ("fake-v1", fake_vllm.url), session
