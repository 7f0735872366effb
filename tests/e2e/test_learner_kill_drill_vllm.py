"""Fault drills: the learner killed (SIGKILL), as a real process, in the middle of a publish
and in the middle of a training step; and stopped (SIGTERM) in the middle of a publish.

Mid-publish, it dies holding the publish lease, with the replica fenced off and a checkpoint
written but nothing recorded. Mid-step, it dies with its optimizer stepped and nothing
written at all, the replica paused for its compute (--time-slice): its guard resumes it.
Either way the next learner (in the test process, to save a second start-up) restores the
serving version (verified; after a publish it takes the lease over and lets the waiting
clients through) and trains the same batch again: one step.
"""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from learner.proxy_process import ProxyServer
from learner.swap.publisher import current_version
from learner.vllm_server import VLLMServer
from store import db
from store.models import Call, TrainingStep
from tests.support.drills import (
    FAST_GATES,
    LearnerThread,
    Traffic,
    assert_baselines_count_each_reward_once,
    assert_invariants,
    drill_learner,
    gated,
    heartbeat,
    learn_command,
    recorded_steps,
    served_by,
    trained_in,
    wait_until,
)

pytestmark = [pytest.mark.vllm]


def held_at_step_1_publish(
    engine: Engine, proxy: ProxyServer, traffic: Traffic, marker: Path
) -> str:
    """Once the learner (tests.support.held_learner) is up: one batch of traffic, then the
    moment its step 1's publish holds, with the replica fenced off and drained, before the
    swap; the version that served before."""
    wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
    base = heartbeat(engine)["serving"]
    traffic.batch("batch")
    wait_until(marker.exists, "the learner publishes step 1", 120)
    assert gated(proxy)  # the replica fenced off
    return base


def test_a_learner_killed_mid_publish_loses_no_step_and_serves_nothing_unverified(
    vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    proxy = start_proxy([vllm.url], pg_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    # the first learner holds step 1's publish with the replica fenced off and drained,
    # before the swap: the moment to kill it in, on any machine
    marker = tmp_path / "held"
    held = ("tests.support.held_learner", "--publish", str(marker))
    command = learn_command(pg_url, vllm, tiny_model, tmp_path, "--max-steps", "1", entry=held)
    log = open(tmp_path / "learner.log", "ab")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    second = drill_learner(pg_url, vllm, tiny_model, tmp_path, max_steps=1)
    try:
        base = held_at_step_1_publish(engine, proxy, traffic, marker)
        first.kill()
        first.wait()
        waiting = traffic.in_parallel(["late-0", "late-1"])  # held until a learner restores

        LearnerThread(second).start().join(180)
        for thread in waiting:
            thread.join(60)

        assert traffic.failures == []
        assert_invariants(engine, traffic.answered)
        with engine.connect() as conn:
            steps = conn.execute(select(TrainingStep.step, TrainingStep.version)).all()
            late = set(
                conn.execute(
                    select(Call.policy_version).where(Call.session_key.like("late-%"))
                ).scalars()
            )
        assert [n for n, _ in steps] == [1] and steps[0][1].startswith("step-1-")
        # answered once a learner let them through: by the restored weights, or (when the
        # restore's opening and step 1's fence came within one look of the proxy) by step 1
        assert late and late <= {base, steps[0][1]}
        assert current_version(vllm.url) == steps[0][1]
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
        second.state.engine.dispose()
        engine.dispose()


def test_a_learner_stopped_mid_publish_finishes_the_swap_first_and_leaves_nothing_fenced(
    vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    """`docker stop`, Ctrl-C, the demo's end: a SIGTERM while the replica is fenced off
    waits for the swap to be verified and recorded, then the learner exits; clients go on
    being answered, by the new version, with no learner left to let them through."""
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    proxy = start_proxy([vllm.url], pg_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    marker = tmp_path / "held"
    held = ("tests.support.held_learner", "--publish-until-signal", str(marker))
    # it would go on to a second step: only the SIGTERM ends it
    command = learn_command(pg_url, vllm, tiny_model, tmp_path, "--max-steps", "2", entry=held)
    log_path = tmp_path / "learner.log"
    with open(log_path, "ab") as log:
        learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        held_at_step_1_publish(engine, proxy, traffic, marker)  # the swap not begun
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=120) == 0, log_path.read_text()[-3000:]

        said = log_path.read_text()
        assert "stopping once the swap under way is verified" in said, said[-3000:]
        assert "onthejob learn: stopped" in said
        # nobody is left to reopen it: the learner did, on its way out, in the store, and the
        # proxy sees that at its next look
        wait_until(lambda: not gated(proxy), "the proxy sees the gate the learner reopened", 15)
        after = traffic.batch("after", 2)
        assert traffic.failures == []
        assert_invariants(engine, traffic.answered)
        steps = recorded_steps(engine)
        assert [n for n, _ in steps] == [1] and steps[0][1].startswith("step-1-")
        assert current_version(vllm.url) == steps[0][1]
        assert served_by(engine, after) == {steps[0][1]}
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
        engine.dispose()


def test_a_learner_killed_mid_step_trains_its_batch_once_after_a_restart(
    vllm: VLLMServer, tiny_model: Path, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db_url = f"sqlite:///{tmp_path / 'drill.db'}"
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    held = tmp_path / "held"  # written when the first learner's step 1 holds
    command = learn_command(
        db_url,
        vllm,
        tiny_model,
        tmp_path,
        "--max-steps",
        "1",
        entry=("tests.support.held_learner", str(held)),
    )
    log = open(tmp_path / "learner.log", "ab")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    second = None
    try:
        wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
        base = heartbeat(engine)["serving"]
        batch = traffic.batch("batch")
        # its optimizer stepped: the new weights exist only in the learner's memory
        wait_until(held.exists, "the learner holds in step 1", 60)
        wait_until(lambda: heartbeat(engine).get("activity") == "training step 1", "step 1")
        # the replica is paused while the step computes (--time-slice): these calls wait
        # (vLLM's gauges say nothing while paused), and once the learner is killed its guard
        # (learner/resume_guard.py) resumes it
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(traffic.batch, "during", 2)
            first.kill()
            first.wait()
            during = waiting.result(timeout=120)
        orphaned = traffic.batch("orphaned", 2)  # no learner at all: the replica serves on

        second = drill_learner(db_url, vllm, tiny_model, tmp_path, max_steps=1)
        LearnerThread(second).start().join(180)
        assert not second.maybe_train()  # the batch is not trained a second time
        after = traffic.batch("after", 2)

        assert traffic.failures == []
        assert_invariants(engine, traffic.answered)
        steps = recorded_steps(engine)
        assert [n for n, _ in steps] == [1] and steps[0][1].startswith("step-1-")
        # the interrupted batch, trained once, in the step the restarted learner recorded
        assert trained_in(engine, batch) == dict.fromkeys(batch, 1)
        assert set(trained_in(engine, during + orphaned).values()) <= {1, None}
        assert_baselines_count_each_reward_once(engine)
        # the killed step's weights never reached a replica, nor a checkpoint
        assert served_by(engine, batch + during + orphaned) == {base}
        assert served_by(engine, after) == {steps[0][1]} == {current_version(vllm.url)}
        written = {p.name for p in (tmp_path / "checkpoints").glob("step-*") if p.is_dir()}
        assert written == {steps[0][1]}
    finally:
        if first.poll() is None:
            first.kill()
        log.close()
        if second is not None:
            second.state.engine.dispose()
        engine.dispose()
