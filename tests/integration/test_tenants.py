"""Tenants through the admin API and the proxy in-process, on SQLite and PostgreSQL: a call
goes to its tenant's adapter (by client key, by X-Onthejob-Type, by fingerprint) where the
replica has it loaded, the shared policy answers it elsewhere, and the record names the
tenant and the version that answered."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import Engine, select

from proxy.recording.interaction import fingerprint
from store import gates, tenants
from store.models import Call, PolicyVersion
from tests.support.adapter_proxy import adapters_read, admin, settings
from tests.support.fake_vllm import FakeVLLM
from tests.support.inprocess import BASE, InProcessProxy, in_process_proxy
from tests.support.records import wait_for_calls

HELLO = [{"role": "user", "content": "hi"}]


async def routed(engine: Engine, tenant: str, version: str, wanted: bool) -> None:
    """Bounded: until whether every live proxy routes `tenant` to `version` is `wanted`."""
    deadline = time.monotonic() + 10
    while True:
        with engine.connect() as conn:
            now = gates.routed_everywhere(
                conn, tenant=tenant, version=version, now=datetime.now(UTC)
            )
        if now == wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"routed {tenant} -> {version} never became {wanted}")
        await asyncio.sleep(0.02)


def chat(proxy: InProcessProxy, key: str = "none", **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=BASE + "/v1",
        api_key=key,
        http_client=proxy.http,
        max_retries=0,
        default_headers=headers or None,
    )


def recorded(engine: Engine, n: int) -> list[tuple[str | None, str | None]]:
    wait_for_calls(engine, n)
    with engine.connect() as conn:
        rows = conn.execute(select(Call.tenant, Call.policy_version).order_by(Call.started_at))
        return [(tenant, version) for tenant, version in rows]


def test_calls_go_to_their_tenants_adapter_where_it_is_loaded(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    system = [{"role": "system", "content": "You triage tickets."}, *HELLO]
    triage = fingerprint({"messages": system}, "triage-bot/1.2")

    async def scenario() -> list[str]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            made = await admin(proxy, "POST", "/keys", json={"name": "alice"})
            alice = made.json()["key"]
            puts = [
                await admin(proxy, "PUT", "/tenants/team-a", json={"client_keys": ["alice"]}),
                await admin(
                    proxy, "PUT", "/tenants/team-b", json={"interaction_types": ["support"]}
                ),
                await admin(proxy, "PUT", "/tenants/team-c", json={"interaction_types": [triage]}),
            ]
            assert [p.status_code for p in puts] == [201, 201, 201]
            for name, version in (("team-a", "a-1"), ("team-b", "b-1"), ("team-c", "c-1")):
                served = await admin(
                    proxy, "PUT", f"/tenants/{name}/serving", json={"version": version}
                )
                assert served.status_code == 200, served.text
            fake_vllm.adapters[:] = ["a-1", "c-1"]  # b-1 is not loaded anywhere
            await adapters_read(proxy, {"a-1", "c-1"})
            listed = (await admin(proxy, "GET", "/tenants")).json()["items"]
            assert {t["name"]: t["loaded_on"] for t in listed} == {
                "team-a": [fake_vllm.url],
                "team-b": [],
                "team-c": [fake_vllm.url],
            }

            seen = []
            for client in (
                chat(proxy, alice),  # by key
                chat(proxy, **{"X-Onthejob-Type": "support"}),  # by type; b-1 not loaded
                chat(proxy),  # nobody's
            ):
                answer = await client.chat.completions.create(model="fake", messages=HELLO)
                seen.append(answer.model)
            # by the fingerprint of the call itself
            triaged = await proxy.http.post(
                "/v1/chat/completions",
                json={"model": "fake", "messages": system},
                headers={"User-Agent": "triage-bot/1.2"},
            )
            seen.append(triaged.json()["model"])
            # a key's tenant wins over a type's
            both = chat(proxy, alice, **{"X-Onthejob-Type": "support"})
            await both.chat.completions.create(model="fake", messages=HELLO)
            # deleted: its calls go to the shared policy, at once
            gone = await admin(proxy, "DELETE", "/tenants/team-a")
            assert gone.status_code == 204
            await chat(proxy, alice).chat.completions.create(model="fake", messages=HELLO)
            return seen

    # the client always sees the model it asked for, whatever answered
    assert asyncio.run(scenario()) == ["fake"] * 4
    assert [r["model"] for r in fake_vllm.requests] == ["a-1", "fake", "fake", "c-1", "a-1", "fake"]
    assert recorded(engine, 6) == [
        ("team-a", "a-1"),
        ("team-b", "fake-v1"),  # its adapter is not loaded: the shared policy answered
        (None, "fake-v1"),
        ("team-c", "c-1"),
        ("team-a", "a-1"),
        (None, "fake-v1"),
    ]


def test_an_unloaded_adapter_is_no_longer_sent_to(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            await admin(proxy, "PUT", "/tenants/ops", json={"interaction_types": ["ops"]})
            pointed = await admin(proxy, "PUT", "/tenants/ops/serving", json={"version": "ops-1"})
            # no version of its lineage serves (none recorded): an operator steers it
            assert pointed.json()["lineage_version"] is None
            assert pointed.json()["steered_by_hand"] is True
            client = chat(proxy, **{"X-Onthejob-Type": "ops"})
            await routed(engine, "ops", "ops-1", False)  # a live proxy, nothing loaded yet
            fake_vllm.adapters[:] = ["ops-1"]
            await adapters_read(proxy, {"ops-1"})
            # the proxy reports the route with its heartbeat: the learner (the guard) knows
            # the tenant's calls now go to ops-1
            await routed(engine, "ops", "ops-1", True)
            await client.chat.completions.create(model="fake", messages=HELLO)
            fake_vllm.adapters[:] = []  # e.g. the replica restarted
            await adapters_read(proxy, set())
            await routed(engine, "ops", "ops-1", False)
            await client.chat.completions.create(model="fake", messages=HELLO)
            # pointed back at the shared policy
            back = await admin(proxy, "PUT", "/tenants/ops/serving", json={"version": None})
            assert back.json()["serving_version"] is None
            assert back.json()["steered_by_hand"] is False  # as its lineage: nothing yet
            await client.chat.completions.create(model="fake", messages=HELLO)

    asyncio.run(scenario())
    assert [r["model"] for r in fake_vllm.requests] == ["ops-1", "fake", "fake"]
    assert recorded(engine, 3) == [("ops", "ops-1"), ("ops", "fake-v1"), ("ops", "fake-v1")]

    # the tenant's traffic, graded (rewards 0.2, 0.4, 0.6 in call order), one trained on
    from store import grade_queue, policy_versions, tenants

    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="fake-v1", ordinal=0, parent=None, checkpoint_path=None,
            status="serving",
        )  # fmt: skip
        policy_versions.add_version(
            conn, version="ops-1", ordinal=1, parent="fake-v1", checkpoint_path=None,
            status="serving", tenant="ops",
        )  # fmt: skip
        trajectories = conn.execute(
            select(Call.trajectory_id).order_by(Call.started_at)
        ).scalars().all()  # fmt: skip
        for k, trajectory in enumerate(trajectories):
            grade_queue.save_grade(
                conn, trajectory_id=trajectory, reward=0.2 * (k + 1), detail={}, error=None
            )
        grade_queue.mark_trained(conn, trajectory_ids=trajectories[:1], step=1)
        stats = tenants.tenant_stats(conn)
        assert tenants.tenant_stats(conn, "ops") == stats  # one tenant's: the same numbers
        assert tenants.tenant_stats(conn, "nobody") == {}
    assert stats["ops"]["graded"] == 3 and stats["ops"]["trained"] == 1
    by_version = [(v["version"], v["trajectories"]) for v in stats["ops"]["by_version"]]
    assert by_version == [("fake-v1", 2), ("ops-1", 1)]  # in the order they served
    rewards = {v["version"]: v["mean_reward"] for v in stats["ops"]["by_version"]}
    assert rewards == {"fake-v1": pytest.approx(0.5), "ops-1": pytest.approx(0.2)}

    # ops-1 now serves its lineage, while its pointer still says the shared policy
    async def listed() -> dict[str, Any]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            (item,) = (await admin(proxy, "GET", "/tenants")).json()["items"]
            return item

    item = asyncio.run(listed())
    assert item["lineage_version"] == "ops-1" and item["steered_by_hand"] is True


def test_tenant_definitions_are_checked(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def scenario() -> dict[str, Any]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            out: dict[str, Any] = {}
            first = {"client_keys": ["alice", "alice"], "interaction_types": ["a"]}
            out["created"] = await admin(proxy, "PUT", "/tenants/one", json=first)
            out["changed"] = await admin(
                proxy, "PUT", "/tenants/one", json={"client_keys": ["alice", "bob"]}
            )
            out["key taken"] = await admin(
                proxy, "PUT", "/tenants/two", json={"client_keys": ["bob"]}
            )
            await admin(proxy, "PUT", "/tenants/two", json={"interaction_types": ["b"]})
            out["type taken"] = await admin(
                proxy, "PUT", "/tenants/one", json={"interaction_types": ["b"]}
            )
            out["empty"] = await admin(proxy, "PUT", "/tenants/three", json={})
            out["bad key"] = await admin(
                proxy, "PUT", "/tenants/three", json={"client_keys": ["no spaces"]}
            )
            out["extra"] = await admin(
                proxy, "PUT", "/tenants/three", json={"interaction_types": ["x"], "weight": 2}
            )
            out["bad name"] = await admin(
                proxy, "PUT", "/tenants/-x", json={"interaction_types": ["x"]}
            )
            out["no such"] = await admin(
                proxy, "PUT", "/tenants/nobody/serving", json={"version": "v"}
            )
            out["no such get"] = await admin(proxy, "GET", "/tenants/nobody")
            out["no such delete"] = await admin(proxy, "DELETE", "/tenants/nobody")
            out["no token"] = await proxy.http.get("/admin/api/tenants")
            out["list"] = await admin(proxy, "GET", "/tenants")
            return out

    out = asyncio.run(scenario())
    assert out["created"].status_code == 201
    assert out["created"].json()["client_keys"] == ["alice"]  # duplicates dropped
    assert out["changed"].status_code == 200
    assert out["changed"].json()["interaction_types"] == []  # replaced, not merged
    for case, param in (("key taken", "client_keys"), ("type taken", "interaction_types")):
        error = out[case].json()["error"]
        assert out[case].status_code == 409, case
        assert error["param"] == param and "already belongs to tenant" in error["message"]
    for case in ("empty", "bad key", "extra", "bad name"):
        assert out[case].status_code == 400, (case, out[case].text)
        assert out[case].json()["error"]["message"], case
    assert "at least one client key or interaction type" in out["empty"].text
    for case in ("no such", "no such get", "no such delete"):
        assert out[case].status_code == 404, case
        assert "no tenant 'nobody'" in out[case].json()["error"]["message"]
    assert out["no token"].status_code == 401
    assert [t["name"] for t in out["list"].json()["items"]] == ["one", "two"]


def test_a_tenant_s_own_canary_settings_are_set_shown_and_cleared(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    own = {"share": 0.3, "min_calls": 20, "watch": {"length_low": 0.2}}

    async def scenario() -> dict[str, Any]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            out: dict[str, Any] = {}
            await admin(proxy, "PUT", "/tenants/one", json={"interaction_types": ["a"]})
            out["fresh"] = await admin(proxy, "GET", "/tenants/one")
            out["set"] = await admin(proxy, "PUT", "/tenants/one/canary", json=own)
            out["kept"] = await admin(  # a new definition keeps them
                proxy, "PUT", "/tenants/one", json={"interaction_types": ["b"]}
            )
            for case, body in (
                ("share 1", {"share": 1.0}),
                ("unknown", {"weight": 2}),
                ("unknown threshold", {"watch": {"no_such": 1}}),
                ("bad decision", {"default_decision": "wait"}),
            ):
                out[case] = await admin(proxy, "PUT", "/tenants/one/canary", json=body)
            out["no such"] = await admin(proxy, "PUT", "/tenants/nobody/canary", json={})
            out["cleared"] = await admin(proxy, "PUT", "/tenants/one/canary", json={})
            return out

    out = asyncio.run(scenario())
    assert out["fresh"].json()["canary"] is None  # the learner's
    assert out["set"].status_code == 200 and out["set"].json()["canary"] == own
    assert out["kept"].json()["canary"] == own
    for case in ("share 1", "unknown", "unknown threshold", "bad decision"):
        assert out[case].status_code == 400, (case, out[case].text)
    assert out["no such"].status_code == 404
    assert out["cleared"].status_code == 200 and out["cleared"].json()["canary"] is None
    with engine.connect() as conn:
        assert tenants.canary_overrides(conn, "one") is None


def test_each_lineage_has_its_own_serving_version_and_staleness_order(engine: Engine) -> None:
    from store import policy_versions

    def add(conn: Any, version: str, tenant: str | None, status: str = "serving") -> None:
        policy_versions.add_version(
            conn,
            version=version,
            ordinal=policy_versions.next_ordinal(conn) if status != "rolled_back" else None,
            parent=None,
            checkpoint_path=f"/ckpt/{version}",
            status=status,
            tenant=tenant,
        )

    with engine.begin() as conn:
        add(conn, "base", None)
        add(conn, "a-1", "a")
        add(conn, "b-1", "b")
        add(conn, "a-2", "a")  # supersedes a-1 only
        add(conn, "b-2", "b", status="rolled_back")  # failed: no ordinal, never served
        add(conn, "a-3", "a")
        serving = {
            t: policy_versions.serving_version(conn, t)["version"]  # type: ignore[index]
            for t in (None, "a", "b")
        }
        ordinals = {t: policy_versions.lineage_ordinals(conn, t) for t in ("a", "b")}
        newest = {t: policy_versions.lineage_newest_first(conn, t) for t in (None, "a", "b")}
        statuses = dict(
            [tuple(r) for r in conn.execute(select(PolicyVersion.version, PolicyVersion.status))]
        )
        policy_versions.set_version_status(conn, version="a-1", status="serving")
        after = {
            t: policy_versions.serving_version(conn, t)["version"]  # type: ignore[index]
            for t in (None, "a", "b")
        }
        # a rollback is checked against what serves the version's own lineage
        own = policy_versions.serving_version(conn, "a")
        policy_versions.check_servable(
            policy_versions.version(conn, version="a-2"), own, "a-2", "promote"
        )
        try:
            policy_versions.check_servable(
                policy_versions.version(conn, version="a-1"), own, "a-1", "rollback"
            )
        except policy_versions.VersionError as exc:
            refused = str(exc)
    assert serving == {None: "base", "a": "a-3", "b": "b-1"}
    assert statuses["a-1"] == statuses["a-2"] == "superseded" and statuses["b-1"] == "serving"
    # a tenant's own steps count 1, 2, 3; the other tenant's do not; the shared policy is 0
    assert ordinals == {
        "a": {"base": 0, "a-1": 1, "a-2": 2, "a-3": 3},
        "b": {"base": 0, "b-1": 1},
    }
    # the adapters a publisher keeps loaded are counted in this order (never a failed one)
    assert newest == {None: ["base"], "a": ["a-3", "a-2", "a-1"], "b": ["b-1"]}
    assert after == {None: "base", "a": "a-1", "b": "b-1"}
    assert refused == "version 'a-1' is already serving"


def test_a_tenant_deleted_and_defined_again_starts_afresh(engine: Engine) -> None:
    """Deleting a tenant takes its lineage out of service, so the same name defined again
    is not read as steered by hand (its new pointer, the shared policy, names nothing its
    old lineage serves) and the learner trains it from the shared policy."""
    from store import policy_versions
    from store import tenants as store_tenants

    now = datetime.now(UTC)
    with engine.begin() as conn:
        store_tenants.put_tenant(conn, name="a", client_keys=["k"], interaction_types=[], now=now)
        for version in ("base", "a-1"):
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=None,
                checkpoint_path=f"/ckpt/{version}",
                status="serving",
                tenant=None if version == "base" else "a",
            )
        store_tenants.set_serving(conn, name="a", version="a-1", now=now)
        assert not store_tenants.steered_by_hand("a-1", policy_versions.serving_name(conn, "a"))
        assert store_tenants.delete_tenant(conn, "a")
        store_tenants.put_tenant(conn, name="a", client_keys=["k"], interaction_types=[], now=now)
        pointer = store_tenants.get_tenant(conn, "a")["serving_version"]  # type: ignore[index]
        lineage = policy_versions.serving_name(conn, "a")
        status = policy_versions.version(conn, version="a-1")["status"]  # type: ignore[index]
        shared = policy_versions.serving_name(conn, None)
    assert (pointer, lineage) == (None, None)
    assert not store_tenants.steered_by_hand(pointer, lineage)
    assert status == "superseded"
    assert shared == "base"  # the shared policy's own version is not touched


def test_a_deleted_tenants_versions_are_orphaned_and_no_others(engine: Engine) -> None:
    """What the learner unloads from the replicas when a tenant goes: its adapters only,
    never the shared policy's or a live tenant's."""
    from store import policy_versions
    from store import tenants as store_tenants

    now = datetime.now(UTC)
    with engine.begin() as conn:
        for name in ("live", "gone"):
            store_tenants.put_tenant(
                conn, name=name, client_keys=[name], interaction_types=[], now=now
            )
        for version, tenant in (("shared-1", None), ("live-1", "live"), ("gone-1", "gone")):
            policy_versions.add_version(
                conn,
                version=version,
                ordinal=policy_versions.next_ordinal(conn),
                parent=None,
                checkpoint_path=f"/ckpt/{version}",
                status="serving",
                tenant=tenant,
            )
        listed = {"shared-1", "live-1", "gone-1", "not-ours"}
        assert store_tenants.orphaned_versions(conn, listed) == set()
        assert store_tenants.delete_tenant(conn, "gone")
        assert store_tenants.orphaned_versions(conn, listed) == {"gone-1"}
        assert store_tenants.orphaned_versions(conn, []) == set()
