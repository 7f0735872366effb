"""The `next_turn` grader: a reward from what the traffic itself said after each turn.

store/next_turn.py reads the certain signals off the conversation (a failed tool call, an
interruption, a word-for-word retry, a user saying the reply was wrong or right). Each reply
scores 0.5 (nothing known), 0 with a bad signal, 1 with a good one; the reward is the mean
over the trajectory's replies, and the detail lists the signals with their evidence (the
learner's per-turn credit, `--credit turn`, trains each judged reply on its own signal
instead). A trajectory with no reply is an error (nothing to judge). Combine it with the
judge (`--grader next_turn --grader judge`) to have the whole trajectory judged as well.
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
        value = {s.call_id: s.value for s in signals}
        scores = [0.5 + 0.5 * value.get(reply, 0.0) for reply in replies]
        return Grade(
            reward=sum(scores) / len(scores),
            detail={"replies": len(replies), "signals": [s.as_dict() for s in signals]},
        )
