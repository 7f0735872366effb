"""The `next_turn` grader: a reward from what the traffic itself said after each turn.

store/next_turn.py reads the certain signals off the conversation (a failed tool call, an
interruption, a word-for-word retry, a user saying the reply was wrong or right), and each
counts by its client key's weight (learner/signals.py, `learn --signal-weight`). Each reply
scores 0.5 (nothing known), moved towards 0 by a bad signal and towards 1 by a good one as
far as its weight says; the reward is the mean over the trajectory's replies, and the detail
lists the signals that count, with their evidence (the learner's per-turn credit,
`--credit turn`, trains each judged reply on its own signal instead). A trajectory with no
reply, or all of whose calls came with a key whose signals are off, is an error: nothing to
judge, or nothing that may count. Combine it with the judge (`--grader next_turn --grader
judge`) to have the whole trajectory judged as well.
"""

from __future__ import annotations

from typing import Any

from learner.graders.base import Grade
from learner.signals import SignalWeights, signals_off, weighed_signals
from store.conversation import conversation
from store.tasks import TaskTable


class NextTurnGrader:
    name = "next_turn"

    def __init__(self, weights: SignalWeights | None = None) -> None:
        self.weights = weights or SignalWeights()

    def grade(self, trajectories: list[dict[str, Any]], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: dict[str, Any]) -> Grade:
        messages = conversation(trajectory.get("calls") or [])
        replies = list(
            dict.fromkeys(
                m["call_id"] for m in messages if m["role"] == "assistant" and m["call_id"]
            )
        )
        if not replies:
            return Grade.failed("the trajectory has no reply to judge")
        off = signals_off(trajectory, self.weights)
        if off is not None:
            return Grade.failed(f"the signals of key {off} are off")
        counted = [s for s in weighed_signals(trajectory, self.weights) if s.weight > 0]
        value = {s.call_id: s.value * s.weight for s in counted}
        scores = [min(1.0, max(0.0, 0.5 + 0.5 * value.get(r, 0.0))) for r in replies]
        signals = [
            {
                "call_id": s.call_id,
                "turn": s.turn,
                "value": s.value * s.weight,
                "rule": s.rule,
                "evidence": s.evidence,
            }
            for s in counted
        ]
        return Grade(
            reward=sum(scores) / len(scores),
            detail={"replies": len(replies), "signals": signals},
        )
