"""The `feedback` grader: rewards posted later by the harness owner or an end user.

Invariant: a trajectory is pending until feedback arrives or `wait_seconds` have passed since
it ended; after that it is an error (skipped), never a guessed reward.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from learner.graders.base import Grade, as_reward
from store.clock import as_utc
from store.export import export_time
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

Posted = tuple[float, str | None]  # (reward, comment)


class FeedbackSource(Protocol):
    def reward_for(self, trajectory_id: str, session: str | None) -> Posted | None:
        """(reward, comment) posted for the trajectory or its session, or None if none yet."""
        ...


def utc_now() -> datetime:
    return datetime.now(UTC)


class FeedbackGrader:
    name = "feedback"

    def __init__(
        self,
        source: FeedbackSource,
        *,
        wait_seconds: float = 3600.0,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self.source = source
        self.wait = timedelta(seconds=wait_seconds)
        self.now = now

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: Trajectory) -> Grade:
        try:
            posted = self.source.reward_for(trajectory.id, trajectory.session)
            if posted is not None:
                reward, comment = posted
                return Grade(reward=as_reward(reward), detail={"comment": comment})
        except Exception as exc:  # a store that is away: later; a malformed reward: never
            return Grade.of_exception(f"feedback: {type(exc).__name__}: {exc}", exc)
        ended = as_utc(trajectory.ended_at)
        if ended is None or self.now() - ended < self.wait:
            return Grade.waiting(ended_at=export_time(trajectory.ended_at))
        return Grade.failed(f"no feedback within {self.wait.total_seconds():g} s of the end")
