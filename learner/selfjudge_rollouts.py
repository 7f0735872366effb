"""The self-judge measured against checks: shadow verdicts on rollout runs.

Rollout runs are graded by their runner (their task's check command, grader or reference
answer: learner/rollout/grading.py), never by the learner, so the learner's grading round
never sees their ground truth. This pass does: it walks the runners' grades once, oldest
first (a cursor in learner_state), and lets the self-judge judge the sample the learner's
shadow sampler picks (its share and rate), storing each verdict with its truth in the
grade's detail under "self_judge", as for organic trajectories. A grade a step trained on
meanwhile is left as it is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from learner.graders.selfjudge import SELF_JUDGE, DefaultGrader
from store import grade_queue, learner_state
from store.export import iter_trajectories
from store.tasks import TaskTable

CURSOR_KEY = "self_judge_rollout_cursor"
BATCH = 64


def truth_source(detail: dict[str, Any]) -> str | None:
    """What graded a run, when that is a ground truth: its check, its reference answer or a
    python:/command: grader (not an LLM judge, not one already judged)."""
    if SELF_JUDGE in detail:
        return None
    if "check" in detail:
        return "check"
    if "reference" in detail:
        return "reference"
    if any(str(key).startswith(("python:", "command:")) for key in detail):
        return "grader"
    return None


def shadow_rollout_grades(engine: Engine, grader: DefaultGrader, tasks: TaskTable) -> int:
    """One batch past the cursor; how many verdicts were stored."""
    if not isinstance(grader, DefaultGrader) or grader.self_judge is None:
        return 0  # a grader a test or an operator put in its place
    if grader.shadow is None or grader.shadow.policy.share <= 0:
        return 0
    with engine.connect() as conn:
        cursor = learner_state.get_state(conn, CURSOR_KEY) or {}
        after = cursor.get("graded_at")
        rows = grade_queue.rollout_grades_after(
            conn,
            after=datetime.fromisoformat(after) if after else None,
            after_id=cursor.get("trajectory_id", ""),
            limit=BATCH,
        )
    if not rows:
        return 0
    truths = {r["trajectory_id"]: (truth_source(r["detail"] or {}), r["reward"]) for r in rows}
    wanted = [tid for tid, (source, _) in truths.items() if source is not None]
    trajectories = list(iter_trajectories(engine, ids=wanted)) if wanted else []
    known = {
        n: (source, float(reward))
        for n, t in enumerate(trajectories)
        for source, reward in [truths[t["id"]]]
        if source is not None
    }
    verdicts = grader.shadow_verdicts(trajectories, known, tasks)
    stored = 0
    with engine.begin() as conn:
        for n, entry in verdicts.items():
            tid = trajectories[n]["id"]
            stored += grade_queue.add_to_grade_detail(
                conn, trajectory_id=tid, key=SELF_JUDGE, value=entry
            )
        last = rows[-1]
        learner_state.set_state(
            conn,
            CURSOR_KEY,
            {"graded_at": last["graded_at"].isoformat(), "trajectory_id": last["trajectory_id"]},
        )
    return stored
