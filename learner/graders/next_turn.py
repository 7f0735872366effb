"""The `next_turn` grader: a reward from what the traffic itself said after each turn.

store/next_turn.py reads the certain signals off the conversation (a failed tool call, an
interruption, a word-for-word retry). The reward is the share of the trajectory's replies
no such signal judged bad; the detail lists the signals with their evidence. A trajectory
with no reply is an error (nothing to judge). Turns the rules say nothing about count as
fine: combine it with the judge (`--grader next_turn --grader judge`) to have those judged.
"""

from __future__ import annotations

from typing import Any

from learner.graders.base import Grade
from store.conversation import conversation
from store.next_turn import next_turn_signals
from store.tasks import TaskTable


class NextTurnGrader:
    name = "next_turn"

    def grade(self, trajectories: list[dict[str, Any]], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: dict[str, Any]) -> Grade:
        messages = conversation(trajectory.get("calls") or [])
        replies = {m["call_id"] for m in messages if m["role"] == "assistant" and m["call_id"]}
        if not replies:
            return Grade.failed("next_turn: the trajectory has no reply to judge")
        signals = next_turn_signals(messages)
        bad = {s.call_id for s in signals if s.value < 0}
        return Grade(
            reward=1.0 - len(bad) / len(replies),
            detail={"replies": len(replies), "signals": [s.as_dict() for s in signals]},
        )
