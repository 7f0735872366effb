"""learner.graders.feedback: waiting for rewards posted by people."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from learner.graders.feedback import FeedbackGrader, FeedbackSource, Posted
from store.tasks import TaskTable
from store.trajectory_record import Trajectory
from tests.support.trajectories import chat_call, trajectory

ENDED = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class DictSource:
    """A FeedbackSource over a dict, keyed by trajectory id or session."""

    def __init__(self, rewards: dict[str, Posted]) -> None:
        self.rewards = rewards
        self.asked: list[tuple[str, str | None]] = []

    def reward_for(self, trajectory_id: str, session: str | None) -> Posted | None:
        self.asked.append((trajectory_id, session))
        return self.rewards.get(trajectory_id) or self.rewards.get(session or "")


class BrokenSource:
    def reward_for(self, trajectory_id: str, session: str | None) -> Posted | None:
        raise ConnectionError("store down")


def _ended(session: str | None = None) -> Trajectory:
    return trajectory(chat_call("x"), session=session, ended_at=ENDED)


def _grader(source: FeedbackSource, *, minutes_later: float, wait: float = 3600) -> FeedbackGrader:
    now = ENDED + timedelta(minutes=minutes_later)
    return FeedbackGrader(source, wait_seconds=wait, now=lambda: now)


def test_posted_reward_with_comment() -> None:
    by_id, by_session = _ended(), _ended(session="s1")
    source = DictSource({by_id.id: (1.0, "great"), "s1": (0, None)})
    grades = _grader(source, minutes_later=1).grade([by_id, by_session], tasks=TaskTable())
    assert [(g.reward, g.detail, g.pending, g.error) for g in grades] == [
        (1.0, {"comment": "great"}, False, None),
        (0.0, {"comment": None}, False, None),
    ]
    assert source.asked[1] == (by_session.id, "s1")


def test_pending_within_the_wait_then_an_error() -> None:
    pending = _grader(DictSource({}), minutes_later=59).grade([_ended()], tasks=TaskTable())[0]
    assert pending.pending and pending.reward is None and pending.error is None
    assert pending.detail == {"ended_at": "2026-01-01T12:00:00+00:00"}  # as the export has it
    late = _grader(DictSource({}), minutes_later=61).grade([_ended()], tasks=TaskTable())[0]
    assert not late.pending and late.reward is None
    assert late.error == "no feedback within 3600 s of the end"


def test_configurable_wait() -> None:
    grader = _grader(DictSource({}), minutes_later=2, wait=60)
    assert grader.grade([_ended()], tasks=TaskTable())[0].error is not None


def test_an_open_trajectory_is_pending() -> None:
    still_open = trajectory(chat_call("x"), ended_at=None)
    (grade,) = _grader(DictSource({}), minutes_later=10_000).grade([still_open], tasks=TaskTable())
    assert grade.pending


def test_source_failures_and_bad_rewards_are_errors() -> None:
    t = _ended()
    broken = _grader(BrokenSource(), minutes_later=1).grade([t], tasks=TaskTable())[0]
    assert broken.error == "feedback: ConnectionError: store down"
    source = DictSource({t.id: (float("nan"), None)})
    bad = _grader(source, minutes_later=1).grade([t], tasks=TaskTable())[0]
    assert bad.reward is None and bad.error is not None and "finite" in bad.error
