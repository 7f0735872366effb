"""learner/shadow_judging.py on SQLite and PostgreSQL: the learner grades without the
self-judge's shadow verdicts, and the pass over the stored grades adds them afterwards, each
with its truth, each grade once, also one a step trained on meanwhile. The judge is a stub
(the real one on vLLM: tests/e2e/test_selfjudge_vllm.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine

from learner import grading, shadow_judging
from learner.graders.base import Grade
from learner.graders.combine import build_graders
from learner.graders.rubrics import Rubrics
from learner.graders.selfjudge import DefaultGrader, SelfJudge, ShadowPolicy, ShadowSampler
from store import grade_queue, recording
from store.tasks import Task, TaskTable
from store.trajectory_loading import load_trajectories
from store.trajectory_record import Trajectory
from tests.support.admin import chat_call

pytestmark = pytest.mark.postgres

TASKS = TaskTable(
    {f"sum-{i}": Task(f"sum-{i}", answer=str(i + i), match="numeric") for i in range(3)}
)


class CountingJudge:
    """Scores every trajectory 0.25 and counts the trajectories it was asked about."""

    def __init__(self, asked: list[str]) -> None:
        self.asked = asked

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        self.asked += [t.id for t in trajectories]
        return [Grade(0.25, {"score": 2}) for _ in trajectories]


def learner_like_grader(asked: list[str]) -> DefaultGrader:
    """The learner's default grader (reference, else self-judge), shadow share 1, judging
    its shadow sample only in the pass."""
    return DefaultGrader(
        build_graders(["reference"]),
        kinds=frozenset({"reference"}),
        self_judge=SelfJudge(Rubrics(), lambda rubric: CountingJudge(asked)),
        shadow=ShadowSampler(ShadowPolicy(share=1.0, per_minute=10_000)),
        shadow_inline=False,
    )


def seed(engine: Engine) -> None:
    """Three replies to tasks with a reference (two right) and one to an open question."""
    now = time.time()
    rows = [("right0", "sum-0", "0"), ("right1", "sum-1", "2"), ("wrong2", "sum-2", "5")]
    rows.append(("open", None, "Blue."))
    with engine.begin() as conn:
        for n, (tid, task_key, reply) in enumerate(rows):
            call = chat_call(
                f"c-{tid}", tid, started=now - 100 + n, prompt=[1, 2, 3], completion=[4, 5],
                messages=[{"role": "user", "content": "What is it?"}], reply=reply, version="v0",
            )  # fmt: skip
            trajectory = {
                "id": tid, "session_key": f"s-{tid}", "task_key": task_key, "group_key": None,
                "status": "open", "started_at": now - 100 + n, "last_call_at": now - 100 + n,
                "ended_at": None, "interaction_type": "arith",
            }  # fmt: skip
            finished = [{"id": tid, "ended_at": now - 99 + n}]
            recording.write_batch(conn, trajectories=[trajectory], calls=[call], finished=finished)


def details(engine: Engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        return grade_queue.grade_details(conn, ["right0", "right1", "wrong2", "open"])


def test_grading_waits_on_no_shadow_verdict_and_the_pass_adds_each_once(engine: Engine) -> None:
    seed(engine)
    asked: list[str] = []
    grader = learner_like_grader(asked)
    trajectories = list(load_trajectories(engine))
    grading.grade_and_save(engine, grader, trajectories, tasks=TASKS, policy=grading.RetryPolicy())
    before = details(engine)
    assert asked == ["open"]  # grading judged only what nothing else could grade
    assert [before[t]["reference"]["reward"] for t in ("right0", "right1", "wrong2")] == [
        1.0,
        1.0,
        0.0,
    ]
    assert all("self_judge" not in before[t] for t in ("right0", "right1", "wrong2"))
    with engine.begin() as conn:  # a step trained on one meanwhile: its verdict still counts
        grade_queue.mark_trained(conn, trajectory_ids=["right1"], step=1)

    assert shadow_judging.shadow_stored_grades(engine, grader, TASKS) == 3
    after = details(engine)
    for tid, reward in (("right0", 1.0), ("right1", 1.0), ("wrong2", 0.0)):
        verdict = after[tid]["self_judge"]
        assert verdict["shadow"] is True and verdict["reward"] == 0.25
        assert verdict["truth"] == {"source": "reference", "reward": reward}
    # the open question's reward was the self-judge's own: no truth to compare it with
    assert "truth" not in after["open"]["self_judge"]
    assert sorted(asked) == ["open", "right0", "right1", "wrong2"]
    # each grade once: the cursor moved past them
    assert shadow_judging.shadow_stored_grades(engine, grader, TASKS) == 0
    assert len(asked) == 4


def test_the_thread_judges_grades_stored_after_it_started_and_stops(engine: Engine) -> None:
    asked: list[str] = []
    grader = learner_like_grader(asked)
    judging = shadow_judging.ShadowJudging(engine, grader, lambda: TASKS).start()
    try:
        seed(engine)
        grading.grade_and_save(
            engine,
            grader,
            list(load_trajectories(engine)),
            tasks=TASKS,
            policy=grading.RetryPolicy(),
        )
        deadline = time.monotonic() + 30
        while judging.stored < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the condition above, with a deadline
    finally:
        judging.stop()
    assert judging.stored == 3
    assert all("truth" in details(engine)[t]["self_judge"] for t in ("right0", "right1", "wrong2"))


@pytest.mark.parametrize(
    ("detail", "source"),
    [
        ({"reference": {"reward": 1.0}}, "reference"),
        ({"python:m:f": {}, "reference": {}}, "python+reference"),
        ({"feedback": {"reward": 0.2}}, "feedback"),
        ({"judge": {}}, None),  # an LLM judge is no ground truth
        ({"reference": {}, "judge": {}}, None),  # nor a mean that includes one
        ({"reference": {}, "self_judge": {}}, None),  # judged already
        ({"rollout_run": "r", "check": "test -f x", "exit_code": 0}, "check"),
        ({"rollout_run": "r", "command:x": {}}, "grader"),
        ({}, None),
    ],
)
def test_what_counts_as_a_ground_truth(detail: dict[str, Any], source: str | None) -> None:
    assert shadow_judging.truth_source(detail) == source
