"""Canaries in the store on SQLite and PostgreSQL (store/canaries.py, store/canary_stats.py):
one running per scope, every action kept with who took it, a promotion that points a tenant
at its candidate, a rollback that moves nothing, and each arm's calls, rewards and signals."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from store import canaries, canary_stats, grade_queue, policy_versions, recording, tenants
from store.turn_signals import Stored, save_signals

HOUR = timedelta(hours=1)


def start(conn: Any, tenant: str | None = "team", **changes: Any) -> int:
    settings: dict[str, Any] = {
        "tenant": tenant,
        "candidate": "team-2",
        "incumbent": "team-1",
        "share": 0.2,
        "min_calls": 50,
        "time_limit": HOUR,
        "default_decision": "rollback",
        "by": "learner",
        "now": datetime.now(UTC),
        **changes,
    }
    return canaries.start_canary(conn, **settings)


def make_tenant(conn: Any, serving: str | None = "team-1") -> None:
    now = datetime.now(UTC)
    tenants.put_tenant(conn, name="team", client_keys=["k"], interaction_types=[], now=now)
    tenants.set_serving(conn, name="team", version=serving, now=now)


def test_one_canary_runs_per_scope(engine: Engine) -> None:
    with engine.begin() as conn:
        make_tenant(conn)
        team = start(conn)
        shared = start(conn, tenant=None, candidate="base-2", incumbent="base-1")
        with pytest.raises(canaries.CanaryError, match="runs for tenant 'team' already"):
            start(conn, candidate="team-3")
        with pytest.raises(canaries.CanaryError, match="already serves"):
            start(conn, tenant="other", candidate="x", incumbent="x")
        for wrong in ({"share": 1.0}, {"share": 0.0}, {"default_decision": "wait"}):
            with pytest.raises(ValueError):
                start(conn, tenant="third", **wrong)
        rules = canaries.running(conn)
    assert rules == [
        canaries.CanaryRule(shared, None, "base-2", 0.2),
        canaries.CanaryRule(team, "team", "team-2", 0.2),
    ]
    with engine.begin() as conn:
        canaries.roll_back(conn, canary_id=team, by="admin", reason="", now=datetime.now(UTC))
        again = start(conn, candidate="team-3")  # the scope is free once decided
        assert [r.id for r in canaries.running(conn)] == [shared, again]


def test_decisions_and_extensions_are_kept_with_who_took_them(engine: Engine) -> None:
    t0 = datetime.now(UTC)
    with engine.begin() as conn:
        make_tenant(conn)
        first = start(conn, by="admin:alice", reason="try it", now=t0)
        extended = canaries.extend(
            conn, canary_id=first, more=HOUR, by="admin:bob", reason="slow day", now=t0
        )
        rolled = canaries.roll_back(
            conn, canary_id=first, by="learner", reason="worse reward", now=t0 + HOUR
        )
        with pytest.raises(canaries.CanaryError, match="rolled_back already"):
            canaries.promote(conn, canary_id=first, by="admin", reason="", now=t0)
        with pytest.raises(canaries.UnknownCanary):
            canaries.roll_back(conn, canary_id=999, by="admin", reason="", now=t0)
        pointer = tenants.get_tenant(conn, "team")
    assert extended["ends_at"] == t0 + 2 * HOUR
    assert rolled["status"] == "rolled_back" and rolled["decided_by"] == "learner"
    assert rolled["reason"] == "worse reward" and rolled["decided_at"] == t0 + HOUR
    assert [(a["action"], a["by"], a["reason"]) for a in rolled["actions"]] == [
        ("start", "admin:alice", "try it"),
        ("extend", "admin:bob", "slow day"),
        ("rollback", "learner", "worse reward"),
    ]
    assert rolled["actions"][1]["detail"]["ends_at"].startswith((t0 + 2 * HOUR).date().isoformat())
    # a rollback leaves what serves the tenant as it was
    assert pointer is not None and pointer["serving_version"] == "team-1"


def test_a_promotion_points_the_tenant_at_its_candidate_and_its_lineage_follows(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        history = [("team-1", "serving"), ("team-2", "superseded")]  # e.g. served before
        for ordinal, (version, status) in enumerate(history):
            policy_versions.add_version(
                conn, version=version, ordinal=ordinal, parent=None, tenant="team",
                checkpoint_path=f"/ckpt/{version}", status=status,
            )  # fmt: skip
        make_tenant(conn)
        canary_id = start(conn)
        promoted = canaries.promote(
            conn, canary_id=canary_id, by="admin", reason="better", now=datetime.now(UTC)
        )
        pointer = tenants.get_tenant(conn, "team")
        lineage = policy_versions.serving_name(conn, "team")
    assert promoted["status"] == "promoted"
    assert pointer is not None and pointer["serving_version"] == "team-2"
    # the pointer and the lineage agree: the learner trains on from the candidate
    assert lineage == "team-2"
    assert not tenants.steered_by_hand(pointer["serving_version"], lineage)


def test_a_deleted_tenants_canary_can_only_be_rolled_back(engine: Engine) -> None:
    now = datetime.now(UTC)
    with engine.begin() as conn:
        make_tenant(conn)
        canary_id = start(conn)
        tenants.delete_tenant(conn, "team")
    with pytest.raises(canaries.CanaryError, match="no longer exists"), engine.begin() as conn:
        canaries.promote(conn, canary_id=canary_id, by="admin", reason="", now=now)
    with engine.begin() as conn:
        assert canaries.roll_back(conn, canary_id=canary_id, by="admin", reason="", now=now)


def calls(tid: str, version: str, at: float, *, tenant: str | None, **more: Any) -> list[dict]:
    """Two calls of trajectory `tid`, both answered by `version`."""
    return [
        {
            "id": f"{tid}-{i}",
            "trajectory_id": tid,
            "session_key": tid,
            "api": "chat.completions",
            "status": "ok",
            "http_status": 200,
            "stream": False,
            "prompt_prefix_len": 0,
            "capture_complete": True,
            "started_at": at + i,
            "latency_ms": 100.0,
            "policy_version": version,
            "tenant": tenant,
            **more,
        }
        for i in range(2)
    ]


def test_each_arm_counts_the_calls_its_version_answered_in_the_scope(engine: Engine) -> None:
    t0 = time.time()
    with engine.begin() as conn:
        make_tenant(conn)
        canary_id = start(conn, now=datetime.fromtimestamp(t0, UTC))
    # (trajectory, version, tenant, reward, extra): the arms, then what counts for neither
    traffic: list[tuple[str, str, str | None, float, dict[str, Any]]] = [
        ("c1", "team-2", "team", 1.0, {}),
        ("c2", "team-2", "team", 0.5, {"status": "error", "latency_ms": 300.0}),
        ("i1", "team-1", "team", 0.0, {}),
        ("i2", "team-1", "team", 0.5, {}),
        ("i3", "team-1", "team", 1.0, {}),
        ("other-tenant", "team-2", "elsewhere", 0.0, {}),
        ("shared", "base-1", None, 0.0, {}),
        ("other-version", "team-0", "team", 0.0, {}),
    ]
    trajectories, rows = [], []
    for k, (tid, version, tenant, _, extra) in enumerate(traffic):
        at = t0 + 1 + k * 10
        trajectories.append({"id": tid, "status": "finished", "started_at": at, "last_call_at": at})
        rows += calls(tid, version, at, tenant=tenant, **extra)
    before = t0 - 100  # a call of the candidate from before the canary started
    trajectories.append({"id": "early", "status": "finished", "started_at": before,
                         "last_call_at": before})  # fmt: skip
    rows += calls("early", "team-2", before, tenant="team")
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=trajectories, calls=rows)
        for tid, _, _, reward, _ in traffic:
            grade_queue.save_grade(conn, trajectory_id=tid, reward=reward, detail={}, error=None)
        signals = [
            Stored("c1-1", 1, -1.0, "corrected", "no, that is wrong", None),
            Stored("c1-1", 2, -1.0, "tool_error", "Traceback", None),
            Stored("c1-0", 0, 1.0, "approved", "thanks", None),
        ]
        save_signals(conn, trajectory_id="c1", signals=signals, now=datetime.now(UTC))
        save_signals(
            conn,
            trajectory_id="i1",
            signals=[Stored("i1-0", 0, -1.0, "retried", "again", None)],
            now=datetime.now(UTC),
        )
        canary = canaries.get_canary(conn, canary_id)
        assert canary is not None
        arms = canary_stats.arm_stats(conn, canary, now=datetime.fromtimestamp(t0 + 3600, UTC))
    candidate, incumbent = arms["candidate"], arms["incumbent"]
    assert (candidate["version"], incumbent["version"]) == ("team-2", "team-1")
    assert (candidate["calls"], candidate["errors"], candidate["error_rate"]) == (4, 2, 0.5)
    assert (incumbent["calls"], incumbent["errors"]) == (6, 0)
    assert candidate["mean_latency_ms"] == pytest.approx(200.0)
    assert candidate["graded"] == 2 and candidate["mean_reward"] == pytest.approx(0.75)
    assert candidate["reward_sd"] == pytest.approx(0.25)
    assert incumbent["graded"] == 3 and incumbent["mean_reward"] == pytest.approx(0.5)
    assert candidate["signals"] == {
        "negative": 2,
        "positive": 1,
        "negative_by_rule": {"corrected": 1, "tool_error": 1},
        "negative_per_call": 0.5,
    }
    assert incumbent["signals"]["negative_by_rule"] == {"retried": 1}


def test_an_unknown_incumbent_is_every_other_version_in_the_scope(engine: Engine) -> None:
    t0 = time.time()
    with engine.begin() as conn:
        canary_id = start(
            conn, tenant=None, candidate="base-2", incumbent=None,
            now=datetime.fromtimestamp(t0, UTC),
        )  # fmt: skip
        trajectories = [
            {"id": tid, "status": "open", "started_at": t0 + 1, "last_call_at": t0 + 1}
            for tid in ("a", "b", "c", "d")
        ]
        rows = (
            calls("a", "base-2", t0 + 1, tenant=None)
            + calls("b", "base-1", t0 + 1, tenant=None)
            + calls("c", "base-1b", t0 + 1, tenant=None)  # swapped during the canary
            + calls("d", "base-2", t0 + 1, tenant="team")  # a tenant's: not the shared scope
        )
        recording.write_batch(conn, trajectories=trajectories, calls=rows)
        canary = canaries.get_canary(conn, canary_id)
        assert canary is not None
        arms = canary_stats.arm_stats(conn, canary, now=datetime.fromtimestamp(t0 + 60, UTC))
    assert arms["candidate"]["calls"] == 2
    assert arms["incumbent"]["calls"] == 4 and arms["incumbent"]["version"] is None
    assert arms["incumbent"]["mean_reward"] is None and arms["incumbent"]["error_rate"] == 0.0
