"""The self-judge measured against ground truth, beside grading rather than in its way.

The agreement figures (proxy/admin/selfjudge.py) compare the self-judge's verdicts with
rewards that are a ground truth: a reference answer, a python:/command: grader, people's
feedback, a rollout run's check. Judging inside the grading round made every step wait on
the served model judging (the first step of `onthejob learn` on its defaults took 49-83 s,
30 s of it such calls: docs/measurements/defaults.md). So the learner grades without them,
and `ShadowJudging` walks the stored grades in a thread of its own, oldest first (a cursor
in learner_state), and lets the self-judge judge the sample its shadow sampler picks (share,
rate, share of the wall time), storing each verdict with its truth in the grade's detail
under "self_judge". A verdict never changes a reward: one that lands after a step trained
on the grade is still stored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from learner.graders.selfjudge import SELF_JUDGE, TRUTH_KINDS, DefaultGrader, shadow_share_of
from store import grade_queue, learner_state
from store.json_types import JsonObject
from store.tasks import TaskTable
from store.trajectory_loading import load_trajectories

log = logging.getLogger("onthejob.learner")

CURSOR_KEY = "self_judge_shadow_cursor"
BATCH = 256  # grades looked at per query (only the sampled share is loaded and judged)
EVERY = 2.0  # seconds between passes once caught up
STOP_WAIT = 5.0  # seconds a stop waits for a pass in flight


def truth_source(detail: JsonObject) -> str | None:
    """What graded a trajectory, when that is a ground truth (None: not one, or judged
    already). A rollout run's grade (its runner's): its check, its reference answer or a
    python:/command: grader. Organic: every grader that scored it is a truth kind, named as
    the inline shadow names them ("reference", "python+reference", "feedback")."""
    if SELF_JUDGE in detail:
        return None
    if "rollout_run" in detail:
        if "check" in detail:
            return "check"
        if "reference" in detail:
            return "reference"
        if any(str(key).startswith(("python:", "command:")) for key in detail):
            return "grader"
        return None
    kinds = {_truth_kind(str(key)) for key in detail}
    if not kinds or None in kinds:
        return None
    return "+".join(sorted(k for k in kinds if k is not None))


def _truth_kind(key: str) -> str | None:
    """The kind of ground truth a configured grader's detail key names ("python:m:f" ->
    "python"), as the inline shadow counts them (TRUTH_KINDS); None for any other grader
    (an LLM judge, the next-turn signals)."""
    kind = key.split(":", 1)[0]
    return kind if kind in TRUTH_KINDS else None


def judges_in_shadow(grader: Any) -> bool:
    """Whether `grader` has a self-judge and a shadow share to judge stored grades with."""
    return (
        isinstance(grader, DefaultGrader)
        and grader.self_judge is not None
        and grader.shadow is not None
        and grader.shadow.policy.share > 0
    )


def shadow_stored_grades(engine: Engine, grader: DefaultGrader, tasks: TaskTable) -> int:
    """One batch of stored grades past the cursor; how many verdicts were stored. Runs until
    the batch is judged, then moves the cursor past it."""
    return _one_pass(engine, grader, tasks)[1]


def _one_pass(engine: Engine, grader: DefaultGrader, tasks: TaskTable) -> tuple[int, int]:
    """(grades looked at, verdicts stored)."""
    if not judges_in_shadow(grader):
        return 0, 0
    with engine.connect() as conn:
        cursor = learner_state.get_state(conn, CURSOR_KEY) or {}
        after = cursor.get("graded_at")
        rows = grade_queue.rewarded_grades_after(
            conn,
            after=datetime.fromisoformat(after) if after else None,
            after_id=cursor.get("trajectory_id", ""),
            limit=BATCH,
        )
    if not rows:
        return 0, 0
    share = grader.shadow.policy.share  # type: ignore[union-attr]
    truths = {
        r.trajectory_id: (truth_source(r.detail or {}), float(r.reward))
        for r in rows
        if shadow_share_of(r.trajectory_id) < share  # the sampler's own cut, early
    }
    wanted = [tid for tid, (source, _) in truths.items() if source is not None]
    trajectories = list(load_trajectories(engine, ids=wanted)) if wanted else []
    known = {n: truths[t.id] for n, t in enumerate(trajectories)}
    verdicts = grader.shadow_verdicts(trajectories, known, tasks)  # type: ignore[arg-type]
    stored = 0
    with engine.begin() as conn:
        for n, entry in verdicts.items():
            stored += grade_queue.add_to_grade_detail(
                conn, trajectory_id=trajectories[n].id, key=SELF_JUDGE, value=entry
            )
        last = rows[-1]
        learner_state.set_state(
            conn,
            CURSOR_KEY,
            {"graded_at": last.graded_at.isoformat(), "trajectory_id": last.trajectory_id},
        )
    return len(rows), stored


class ShadowJudging:
    """The pass above in a thread of its own, every EVERY seconds once caught up."""

    def __init__(
        self, engine: Engine, grader: DefaultGrader, tasks: Callable[[], TaskTable]
    ) -> None:
        self.engine = engine
        self.grader = grader
        self.tasks = tasks
        self.stored = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ShadowJudging:
        self._thread = threading.Thread(target=self._run, name="shadow-judging", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Bounded: a judge call in flight (up to 30 s) does not hold the learner's stop;
        its verdict is judged again by the next learner (the cursor did not move)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                looked, stored = _one_pass(self.engine, self.grader, self.tasks())
                self.stored += stored
            except Exception as exc:  # the store or the judge is away: look again later
                log.debug("shadow judging: %s", exc)
                looked = 0
            if looked < BATCH:
                self._stop.wait(EVERY)
