"""The reward-hacking watch on stored traffic, on SQLite and PostgreSQL: the windows read
from what the calls recorded (store/watch_windows.py); a canary whose candidate wins on
reward while its replies collapse or its refusals grow is held, not promoted, with the hold
and its alerts recorded (learner/loop/canaries.py); without the alert it is promoted; at the
time limit a held one is rolled back; a tenant's own thresholds apply to its canaries;
/metrics and the admin API show the alerts."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, update

from learner.loop.canaries import Canaries
from learner.vllm_server import free_port
from store import (
    canaries,
    policy_versions,
    tenants,
    watch_alerts,
    watch_windows,
)
from store.models import Canary
from tests.support import canary_traffic
from tests.support.inprocess import in_process_client

T0 = time.time() - 600  # the canaries started 10 minutes ago; their calls since
WORDY = "Here is the change, with the reasons for each part of it. " * 3
REFUSAL = "I'm sorry, but I can't help with that."
COLLAPSE = "reply length collapsing"


def start(engine: Engine, tenant: str, *, candidate: str, incumbent: str, **changes: Any) -> int:
    with engine.begin() as conn:
        now = datetime.now(UTC)
        tenants.put_tenant(conn, name=tenant, client_keys=[], interaction_types=[], now=now)
        tenants.set_serving(conn, name=tenant, version=incumbent, now=now)
        settings: dict[str, Any] = {
            "share": 0.5, "min_calls": 30, "time_limit": timedelta(hours=1),
            "default_decision": "rollback", "by": "admin",
            "now": datetime.fromtimestamp(T0, UTC), **changes,
        }  # fmt: skip
        return canaries.start_canary(
            conn, tenant=tenant, candidate=candidate, incumbent=incumbent, **settings
        )


# one single-call trajectory per reward, answered by a version after T0 with a reply
# (WORDY in 120 tokens unless told), graded; the first `complaints` corrected, the others
# approved
serve = partial(canary_traffic.serve, at=T0 + 1, text=WORDY, approve_others=True)


def canary(engine: Engine, canary_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        found = canaries.get_canary(conn, canary_id)
    assert found is not None
    return found


def look(engine: Engine) -> int:
    return Canaries(engine).decide_running()


def test_a_tenant_s_own_watch_thresholds_apply_to_its_canaries(engine: Engine) -> None:
    """The same collapsing replies: held at the code's thresholds, promoted for a tenant that
    lets replies shrink to a hundredth (PUT /admin/api/tenants/NAME/canary)."""
    strict = start(engine, "strict", candidate="strict-2", incumbent="strict-1")
    lenient = start(engine, "lenient", candidate="lenient-2", incumbent="lenient-1")
    with engine.begin() as conn:
        tenants.set_canary(
            conn, name="lenient", overrides={"watch": {"length_low": 0.01}}, now=datetime.now(UTC)
        )
    for tenant in ("strict", "lenient"):
        serve(engine, tenant, f"{tenant}-2", [1.0, 1.0, 0.0, 1.0] * 15, text="Done.", tokens=3)
        serve(engine, tenant, f"{tenant}-1", [0.0, 0.0, 1.0, 0.0] * 15)

    assert look(engine) == 1

    assert canary(engine, lenient)["status"] == "promoted"
    held = canary(engine, strict)
    assert held["status"] == "running" and held["actions"][-1]["action"] == "hold"
    assert held["actions"][-1]["detail"]["detectors"] == [COLLAPSE]


def test_the_windows_are_read_from_what_the_calls_recorded(engine: Engine) -> None:
    canary_id = start(engine, "team", candidate="team-2", incumbent="team-1")
    after = serve(
        engine, "team", "team-2", [1.0, 0.0] * 3, text=REFUSAL, tokens=9, complaints=2,
        tool_arguments='{"path": "a.py"', judge=0.0,
    )  # fmt: skip
    before = serve(engine, "team", "team-1", [0.0] * 4, tool_arguments='{"path": "a.py"}')
    serve(engine, "other", "team-2", [1.0] * 3)  # another scope's: not in the windows
    with engine.connect() as conn:
        found = canaries.get_canary(conn, canary_id)
        assert found is not None
        windows = watch_windows.canary_windows(
            conn, canary_id=canary_id, tenant="team", candidate="team-2", incumbent="team-1",
            since=found["started_at"], until=datetime.now(UTC),
        )  # fmt: skip
    assert (windows.scope, windows.version, windows.baseline) == ("team", "team-2", "team-1")
    assert sorted(s.trajectory_id for s in windows.after) == sorted(after)
    assert sorted(s.trajectory_id for s in windows.before) == sorted(before)
    assert windows.signals_recorded
    by_id = {s.trajectory_id: s for s in windows.after}
    first, second = by_id["team-team-2-0"], by_id["team-team-2-1"]
    assert (first.reward, first.graded, first.complained) == (1.0, True, True)
    assert first.reply_tokens == 9
    assert [(r.text, r.tool_calls, r.broken_tool_calls) for r in first.replies] == [
        (REFUSAL, 1, 1)  # its arguments are not JSON: a tool call that fails to parse
    ]
    # the self-judge said fail: it disagrees where the truth passed, agrees where it failed
    assert (first.judge_disagrees, second.judge_disagrees) == (True, False)
    assert not by_id["team-team-2-5"].complained
    assert all(r.broken_tool_calls == 0 for s in windows.before for r in s.replies)
    assert all(s.judge_disagrees is None for s in windows.before)  # no self-judge verdict


def test_a_better_reward_with_collapsing_replies_is_held_and_recorded(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    held = start(engine, "gamed", candidate="gamed-2", incumbent="gamed-1")
    serve(engine, "gamed", "gamed-2", [1.0, 1.0, 0.0, 1.0] * 15, text="Done.", tokens=3)
    serve(engine, "gamed", "gamed-1", [0.0, 0.0, 1.0, 0.0] * 15)
    refusing = start(engine, "refusing", candidate="refusing-2", incumbent="refusing-1")
    serve(engine, "refusing", "refusing-2", [1.0, 1.0, 0.0, 1.0] * 15, text=REFUSAL)
    serve(engine, "refusing", "refusing-1", [0.0, 0.0, 1.0, 0.0] * 15)
    # the same better reward, nothing else moved: promoted
    honest = start(engine, "honest", candidate="honest-2", incumbent="honest-1")
    serve(engine, "honest", "honest-2", [1.0, 1.0, 0.0, 1.0] * 15)
    serve(engine, "honest", "honest-1", [0.0, 0.0, 1.0, 0.0] * 15)

    assert look(engine) == 1
    assert look(engine) == 0  # a second look: still held, no second hold recorded

    assert canary(engine, honest)["status"] == "promoted"
    for canary_id, detector in ((held, COLLAPSE), (refusing, "refusals")):
        found = canary(engine, canary_id)
        assert found["status"] == "running"
        assert [a["action"] for a in found["actions"]] == ["start", "hold"]
        hold = found["actions"][-1]
        assert hold["by"] == "learner"
        assert "reward is better" in hold["reason"] and detector in hold["reason"]
        assert hold["detail"]["detectors"] == [detector]
    with engine.connect() as conn:
        active = watch_alerts.active(conn)
        tenant_of = {c: canary(engine, c)["tenant"] for c in (held, refusing)}
        assert sorted((tenant_of[a.canary_id], a.detector) for a in active) == [
            ("gamed", COLLAPSE),
            ("refusing", "refusals"),
        ]
        assert watch_alerts.counts(conn)[COLLAPSE] == watch_alerts.DetectorCount(1, 1)

    shown = admin_and_metrics(db_url, tmp_path, held)
    (alert,) = shown["canary"]["alerts"]
    assert (alert["detector"], alert["version"], alert["baseline"]) == (
        COLLAPSE, "gamed-2", "gamed-1",
    )  # fmt: skip
    assert alert["cleared_at"] is None and "120 -> 3 tokens" in alert["reason"]
    assert shown["canary"]["actions"][-1]["action"] == "hold"
    assert {a["detector"] for a in shown["watch"]["active"]} == {COLLAPSE, "refusals"}
    counts = {d["detector"]: d["active"] for d in shown["watch"]["detectors"]}
    assert counts[COLLAPSE] == 1 and counts["reply length exploding"] == 0
    assert shown["metrics"][("onthejob_watch_alerts", COLLAPSE)] == 1
    assert shown["metrics"][("onthejob_watch_alerts", "refusals")] == 1
    assert shown["metrics"][("onthejob_watch_alerts", "reply length exploding")] == 0
    assert shown["metrics"][("onthejob_watch_alerts_raised_total", COLLAPSE)] == 1

    # at the time limit, a held promotion is rolled back; nothing that serves moves
    with engine.begin() as conn:
        conn.execute(update(Canary).where(Canary.id == held).values(ends_at=datetime.now(UTC)))
    assert look(engine) == 1
    rolled = canary(engine, held)
    assert (rolled["status"], rolled["decided_by"]) == ("rolled_back", "learner")
    assert "held its promotion" in rolled["reason"] and COLLAPSE in rolled["reason"]
    with engine.connect() as conn:
        pointer = tenants.get_tenant(conn, "gamed")
        assert pointer is not None and pointer["serving_version"] == "gamed-1"
        # a decided canary's alerts no longer count as active
        assert [a.detector for a in watch_alerts.active(conn)] == ["refusals"]


def admin_and_metrics(db_url: str, tmp_path: Path, canary_id: int) -> dict[str, Any]:
    dead = f"http://127.0.0.1:{free_port()}"
    settings = {"upstreams": [dead], "database_url": db_url, "admin_token": "t"}
    headers = {"Authorization": "Bearer t"}
    with in_process_client(spool_path=tmp_path / "spool.jsonl", **settings) as proxy:
        one = proxy.get(f"/admin/api/canaries/{canary_id}", headers=headers)
        watch = proxy.get("/admin/api/watch", headers=headers)
        metrics = proxy.get("/metrics")
    assert one.status_code == 200 and watch.status_code == 200, (one.text, watch.text)
    return {
        "canary": one.json(),
        "watch": watch.json(),
        "metrics": {
            (sample.name, sample.labels.get("detector")): sample.value
            for family in text_string_to_metric_families(metrics.text)
            for sample in family.samples
            if sample.name.startswith("onthejob_watch")
        },
    }


def test_a_promotion_is_never_taken_on_an_old_reading_of_the_watch(engine: Engine) -> None:
    canary_id = start(engine, "team", candidate="team-2", incumbent="team-1")
    serve(engine, "team", "team-2", [1.0] * 20)
    serve(engine, "team", "team-1", [0.0] * 20)
    learner = Canaries(engine)
    assert learner.decide_running() == 0  # too few calls; the watch read nothing to say
    assert learner.watched[canary_id][1] == []
    # the candidate's replies collapse while its reward wins; the watch's reading is recent,
    # yet a promotion makes it read again
    with engine.begin() as conn:
        conn.execute(update(Canary).where(Canary.id == canary_id).values(min_calls=60))
    later = [1.0, 1.0, 0.0, 1.0] * 10
    serve(engine, "team", "team-2", later, text="Done.", tokens=3, first=20)
    serve(engine, "team", "team-1", [1.0 - r for r in later], first=20)
    learner.last_look = float("-inf")
    assert learner.decide_running() == 0
    found = canary(engine, canary_id)
    assert found["status"] == "running"
    assert found["actions"][-1]["action"] == "hold"
    assert COLLAPSE in found["actions"][-1]["reason"]


def test_an_alert_is_raised_kept_and_cleared_and_the_newest_version_watched(
    engine: Engine,
) -> None:
    t0 = datetime.now(UTC)
    collapse = watch_alerts.Found(COLLAPSE, "median reply 120 -> 3 tokens")
    refusals = watch_alerts.Found("refusals", "refusals: 0% -> 50%")
    with engine.begin() as conn:
        for version in ("base-1", "base-2"):
            policy_versions.add_version(
                conn, version=version, ordinal=int(version[-1]), parent=None,
                checkpoint_path="/c", status="serving",
            )  # fmt: skip

    def record(version: str, found: list[watch_alerts.Found], at: datetime) -> Any:
        with engine.begin() as conn:
            return watch_alerts.record(
                conn, scope="*", version=version, baseline="base-1", canary_id=None,
                found=found, now=at,
            )  # fmt: skip

    first = record("base-2", [collapse], t0)
    assert (first.raised, first.cleared) == ([collapse], [])
    kept = record("base-2", [collapse, refusals], t0 + timedelta(minutes=1))
    assert (kept.raised, kept.cleared) == ([refusals], [])
    gone = record("base-2", [refusals], t0 + timedelta(minutes=2))
    assert (gone.raised, gone.cleared) == ([], [COLLAPSE])
    # a newer version: the older one's alerts no longer stand
    newer = record("base-3", [], t0 + timedelta(minutes=3))
    assert newer.cleared == ["refusals"]
    with engine.connect() as conn:
        assert watch_alerts.active(conn) == []
        counts = watch_alerts.counts(conn)
    assert counts[COLLAPSE] == watch_alerts.DetectorCount(0, 1)
    assert counts["refusals"] == watch_alerts.DetectorCount(0, 1)

    # the shared policy's newest version against the one before, from their calls
    serve_shared = [("base-2", "Done.", 3), ("base-1", WORDY, 120)]
    for version, text, tokens in serve_shared:
        serve_untenanted(engine, version, text=text, tokens=tokens)
    learner = Canaries(engine)
    assert learner.decide_running() == 0
    with engine.connect() as conn:
        (alert,) = watch_alerts.active(conn)
    assert (alert.canary_id, alert.version, alert.baseline) == (None, "base-2", "base-1")
    assert alert.detector == COLLAPSE


def serve_untenanted(engine: Engine, version: str, *, text: str, tokens: int) -> None:
    """60 calls of no tenant answered by `version` just now (the newest-version watch
    reads the last day), not graded."""
    at = time.time()
    canary_traffic.serve(
        engine, None, version, [None] * 60, at=at, spacing=0, text=text, tokens=tokens
    )
