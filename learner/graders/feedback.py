"""The `feedback` grader: rewards posted later by the harness owner or an end user.

Invariant: a trajectory is pending until feedback arrives or `wait_seconds` have passed since
it ended; after that it is an error (skipped), never a guessed reward.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from learner.graders.base import Grade, as_reward
from store.tasks import TaskTable

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

    def grade(self, trajectories: list[dict[str, Any]], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: dict[str, Any]) -> Grade:
        try:
            posted = self.source.reward_for(str(trajectory["id"]), trajectory.get("session"))
            if posted is not None:
                reward, comment = posted
                return Grade(reward=as_reward(reward), detail={"comment": comment})
            ended = parse_time(trajectory.get("ended_at"))
        except Exception as exc:  # a store that is away: later; a malformed record: never
            return Grade.of_exception(f"feedback: {type(exc).__name__}: {exc}", exc)
        if ended is None or self.now() - ended < self.wait:
            return Grade.waiting(ended_at=trajectory.get("ended_at"))
        return Grade.failed(f"no feedback within {self.wait.total_seconds():g} s of the end")


def parse_time(value: str | None) -> datetime | None:
    """An export timestamp (ISO 8601, UTC) as an aware datetime; None stays None."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
