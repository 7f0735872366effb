"""Fault drill: the learner killed (SIGKILL) in the middle of a publish, as a real process.

It dies holding the publish lease, with the replica fenced off and a checkpoint written but
nothing recorded. The next learner (in the test process, to save a second start-up) takes
the lease over, restores the serving version (verified), lets the waiting clients through
and trains the same batch again: one step.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from learner.demo.vllm_server import VLLMServer
from learner.publisher import current_version
from proxy.store import db
from proxy.store.models import Call, TrainingStep
from tests.drills import (
    FAST_GATES,
    LearnerThread,
    Stream,
    Traffic,
    assert_invariants,
    drill_learner,
    gated,
    graded_count,
    heartbeat,
    learn_command,
    wait_until,
)

pytestmark = [pytest.mark.vllm]


def test_a_learner_killed_mid_publish_loses_no_step_and_serves_nothing_unverified(
    vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    proxy = start_proxy([vllm.url], pg_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    command = learn_command(pg_url, vllm, tiny_model, tmp_path, "--max-steps", "1")
    log = open(tmp_path / "learner.log", "ab")
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    second = drill_learner(pg_url, vllm, tiny_model, tmp_path, max_steps=1)
    try:
        wait_until(lambda: heartbeat(engine).get("serving"), "the learner is up", 120)
        base = heartbeat(engine)["serving"]
        # seven of the batch graded; the eighth arrives while a client streams, so the
        # learner's publish waits for that stream to drain: a moment to kill it in
        sessions = traffic.batch("batch", 7)
        wait_until(lambda: graded_count(engine, sessions) == 7, "seven graded")
        stream = Stream(traffic, "streaming").start()
        traffic.call("batch-7")
        wait_until(
            lambda: heartbeat(engine).get("activity") == "publishing step 1" and gated(proxy),
            "the learner publishes step 1, the replica fenced off",
        )
        first.kill()
        first.wait()
        waiting = traffic.in_parallel(["late-0", "late-1"])  # held until a learner restores
        stream.finish()

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
        second.engine.dispose()
        engine.dispose()
