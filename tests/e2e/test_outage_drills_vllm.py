"""Fault drills: the store and vLLM go away in the middle of the learner's work.

PostgreSQL (a private server, stopped and started again) stops while the learner's publish
has its replica fenced off and drained, and while it is inside a training step; vLLM is
killed at that same point of a publish (the publish is held there: tests/support/drills.py
HeldPublish).
Either way the learner survives and says why in its log, nothing is served by unverified
weights (clients wait at the fenced replica, or get a 503 after ONTHEJOB_GATE_WAIT), the
step is neither lost nor doubled, and once the server is back the learner restores the
serving version and trains on.
"""

from __future__ import annotations

import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from learner.vllm_server import VLLMServer
from store import db
from store.models import Call, PolicyVersion, TrainingStep
from tests.support.drills import (
    FAST_GATES,
    HeldPublish,
    HeldStep,
    LearnerThread,
    Traffic,
    assert_baselines_count_each_reward_once,
    assert_invariants,
    drill_learner,
    gated,
    heartbeat,
    recorded_steps,
    served_by,
    trained_in,
    wait_until,
)
from tests.support.paths import REUSE_VLLM_URL
from tests.support.private_postgres import PrivatePostgres, binaries

pytestmark = [pytest.mark.vllm]
# held calls give up quickly, so a drill sees what a client sees while the replica is away
SHORT_WAIT = {**FAST_GATES, "ONTHEJOB_GATE_WAIT": "3"}


def test_postgres_stopped_during_a_publish(
    vllm: VLLMServer,
    tiny_model: Path,
    start_proxy,
    tmp_path: Path,
    restore_vllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = binaries()
    if found is None:
        pytest.skip("NO POSTGRESQL SERVER BINARIES (/usr/lib/postgresql/*/bin): drill not run")
    pg = PrivatePostgres(found).init()
    engine = None
    running = None
    try:
        db.upgrade(pg.url)
        engine = db.make_engine(pg.url)
        proxy = start_proxy([vllm.url], pg.url, args=["--idle-timeout", "0.3"], env=SHORT_WAIT)
        traffic = Traffic(proxy, vllm.model_name)
        learner = drill_learner(pg.url, vllm, tiny_model, tmp_path, max_steps=1)
        # step 1's publish holds with its replica fenced off and drained: the store goes
        # away right there, on any machine
        publish = HeldPublish(monkeypatch, "step-1-")
        running = LearnerThread(learner).start()
        wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
        traffic.batch("batch")
        assert publish.reached.wait(120), (
            f"the learner never published step 1: {learner.state.activity}"
        )
        assert gated(proxy)

        pg.stop()
        publish.released.set()
        # the proxy still answers: a call for the fenced replica waits, then a 503
        held = traffic.call("held", timeout=30)
        assert held.status_code == 503 and held.json()["error"]["code"] == "upstream_busy"
        wait_until(lambda: "retrying" in learner.state.activity, "the learner waits for the store")

        pg.start()
        running.join(180)  # it restores the serving version, then trains the batch again
        traffic.batch("after")
        assert traffic.failures == ["held: 503 " + held.text[:200]]
        assert_invariants(engine, traffic.answered)
        with engine.connect() as conn:
            steps = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
            after = set(
                conn.execute(
                    select(Call.policy_version).where(Call.session_key.like("after-%"))
                ).scalars()
            )
        assert [n for n, _ in steps] == [1] and steps[0][1] is not None
        assert after == {steps[0][1]}
    finally:
        if running is not None:
            running.stop()
        if engine is not None:
            engine.dispose()
        pg.remove()


def test_postgres_stopped_during_a_step(
    vllm: VLLMServer,
    tiny_model: Path,
    start_proxy,
    tmp_path: Path,
    restore_vllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = binaries()
    if found is None:
        pytest.skip("NO POSTGRESQL SERVER BINARIES (/usr/lib/postgresql/*/bin): drill not run")
    pg = PrivatePostgres(found).init()
    engine = None
    learner = None
    running = None
    step = HeldStep(monkeypatch)
    caplog.set_level(logging.WARNING, logger="onthejob.learner")
    try:
        db.upgrade(pg.url)
        engine = db.make_engine(pg.url)
        proxy = start_proxy([vllm.url], pg.url, args=["--idle-timeout", "0.3"], env=SHORT_WAIT)
        traffic = Traffic(proxy, vllm.model_name)
        learner = drill_learner(pg.url, vllm, tiny_model, tmp_path, max_steps=1)
        running = LearnerThread(learner).start()
        wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
        base = heartbeat(engine)["serving"]
        batch = traffic.batch("batch")
        assert step.reached.wait(60), "step 1 never trained"

        pg.stop()  # the optimizer stepped; nothing records the step yet
        # the proxy answers on, recording into its spool: once the step is done, as the
        # replica is paused while the step computes (--time-slice)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(traffic.batch, "during", 2)
            step.released.set()  # the step ends into a store that is away
            during = waiting.result(timeout=120)
        wait_until(lambda: "retrying" in learner.state.activity, "the learner waits for the store")

        pg.start()
        running.join(180)  # it trains the batch again, from the serving weights
        after = traffic.batch("after", 2)
        assert traffic.failures == []
        assert_invariants(engine, traffic.answered)
        steps = recorded_steps(engine)
        assert [n for n, _ in steps] == [1] and steps[0][1].startswith("step-1-")
        assert trained_in(engine, batch) == dict.fromkeys(batch, 1)
        assert set(trained_in(engine, during).values()) <= {1, None}
        assert_baselines_count_each_reward_once(engine)
        assert served_by(engine, batch + during) == {base}
        assert served_by(engine, after) == {steps[0][1]}
        # why it waited, in its log: the store was unreachable
        said = [r.getMessage() for r in caplog.records if r.name == "onthejob.learner"]
        assert any("trying again" in m and "OperationalError" in m for m in said), said
    finally:
        step.released.set()
        if running is not None:
            running.stop()
        if learner is not None:
            learner.state.engine.dispose()
        if engine is not None:
            engine.dispose()
        pg.remove()


@pytest.mark.skipif(REUSE_VLLM_URL is not None, reason="kills and restarts the vLLM server")
def test_vllm_killed_during_a_publish(
    vllm: VLLMServer,
    tiny_model: Path,
    pg_url: str,
    start_proxy,
    tmp_path: Path,
    restore_vllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    proxy = start_proxy([vllm.url], pg_url, args=["--idle-timeout", "0.3"], env=SHORT_WAIT)
    traffic = Traffic(proxy, vllm.model_name)
    learner = drill_learner(pg_url, vllm, tiny_model, tmp_path, max_steps=2)
    # step 1's publish holds with its replica fenced off and drained, before the swap: vLLM
    # dies right there, on any machine (a stream to drain made the moment a race)
    publish = HeldPublish(monkeypatch, "step-1-")
    running = LearnerThread(learner)
    try:
        running.start()
        wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
        base = heartbeat(engine)["serving"]
        traffic.batch("batch")
        assert publish.reached.wait(120), (
            f"the learner never published step 1: {learner.state.activity}"
        )
        assert gated(proxy)

        assert vllm.proc is not None
        os.killpg(vllm.proc.pid, signal.SIGKILL)
        vllm.proc.wait()
        vllm.proc = None
        publish.released.set()
        wait_until(lambda: "retrying" in learner.state.activity, "the learner waits for vLLM", 60)
        held = traffic.call("held", timeout=30)
        assert held.status_code == 503  # fenced off: nobody gets a replica in an unknown state

        vllm.start()  # the same port; it serves the base model from disk again
        # the learner's back-off (up to 10 s) may outlast a held call's 3 s: the "after"
        # batch goes once the serving version is restored, or it is turned away and step 2
        # has nothing to train on
        wait_until(lambda: not gated(proxy), "the learner restores the serving version", 120)
        traffic.batch("after")
        assert not [f for f in traffic.failures if f.startswith("after-")], traffic.failures
        running.join(240)
        assert_invariants(engine, traffic.answered)
        with engine.connect() as conn:
            steps = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
            failed = (
                conn.execute(select(PolicyVersion.version).where(PolicyVersion.ordinal.is_(None)))
                .scalars()
                .all()
            )
            after = set(
                conn.execute(
                    select(Call.policy_version).where(Call.session_key.like("after-%"))
                ).scalars()
            )
        # step 1's version never served (vLLM died under it); step 2 came after the restore
        assert [n for n, _ in steps] == [1, 2] and steps[0][1] is None and steps[1][1]
        assert len(failed) == 1 and after == {base}
        assert httpx.get(vllm.url + "/health").status_code == 200
    finally:
        publish.released.set()
        running.stop()
        learner.state.engine.dispose()
        engine.dispose()
