"""Grading in the loop: what finished is graded, newest first, and what is too stale to
train on is recorded as not graded."""

from __future__ import annotations

import logging
import time

from tqdm import tqdm

from learner import grading
from learner.loop.state import LoopState
from store import grade_queue, policy_versions
from store.trajectory_loading import load_trajectories

log = logging.getLogger("onthejob.learner")

GRADE_BATCH = 256
STALE_BATCH = 4096  # trajectories recorded as too stale to grade at one time, at most
PENDING_RECHECK = 30.0  # seconds before trajectories waiting for feedback are graded again


class Grading:
    """Grade finished trajectories."""

    def __init__(self, state: LoopState) -> None:
        self.state = state
        self.pending: set[str] = set()  # waiting for feedback: not graded before a recheck
        self.pending_since = time.monotonic()
        self.progress: tqdm | None = None  # shown while a backlog is graded

    def grade_finished(self) -> int:
        """Grade what finished (and failed gradings now due again), newest first; how many
        were saved, with those too stale to train on, recorded without a grader call."""
        state = self.state
        skipped = self.skip_stale()
        with state.engine.connect() as conn:
            if time.monotonic() - self.pending_since > PENDING_RECHECK:
                # feedback may have arrived for what was waiting: look at it again
                self.pending, self.pending_since = set(), time.monotonic()
            keys = state.config.keys
            ids = grade_queue.ungraded_finished(
                conn, limit=GRADE_BATCH, skip=sorted(self.pending), keys=keys
            )
            backlog = (
                grade_queue.count_ungraded_finished(conn, keys=keys)
                if len(ids) == GRADE_BATCH
                else 0
            )
        if backlog > GRADE_BATCH and self.progress is None:
            # a long phase (e.g. a learner started on a full database): show progress
            self.progress = tqdm(total=backlog, desc="grading", unit="trajectory")
        if not ids:
            return skipped
        trajectories = list(load_trajectories(state.engine, ids=ids))
        outcome = grading.grade_and_save(
            state.engine,
            state.grader,
            trajectories,
            tasks=state.tasks,
            policy=state.retry_policy,
            signal_weights=state.signal_weights,
        )
        self.pending.update(outcome.pending)  # not before the next recheck
        if self.progress is not None:
            self.progress.update(len(trajectories))
            if len(ids) < GRADE_BATCH:
                self.progress.close()
                self.progress = None
        return outcome.saved + skipped

    def skip_stale(self) -> int:
        """Record the ungraded trajectories served more than max_staleness versions before
        the serving one as not graded: no step could train on them (grouping drops them),
        and a learner that fell behind would otherwise spend its grader calls on them first.
        The next step counts them (`stale_not_graded`). How many there were."""
        staleness = self.state.grouping.max_staleness
        with self.state.engine.begin() as conn:
            serving = policy_versions.serving_version(conn)
            if serving is None or serving["ordinal"] is None:
                return 0
            below = int(serving["ordinal"]) - staleness
            if below <= 0:  # ordinals start at 0: nothing can be that old yet
                return 0
            ids = grade_queue.stale_ungraded(
                conn, below_ordinal=below, limit=STALE_BATCH, keys=self.state.config.keys
            )
            detail = {
                "not_graded": "stale",
                "serving_ordinal": int(serving["ordinal"]),
                "max_staleness": staleness,
            }
            grade_queue.skip_stale(conn, trajectory_ids=ids, detail=detail)
        if ids:
            log.info(
                "%d finished trajectories are more than %d versions older than the serving "
                "one: not graded",
                len(ids),
                staleness,
            )
        return len(ids)
