"""The `next_turn` grader: a reward from what the traffic itself said after each turn.

store/next_turn.py reads the certain signals off the conversation (a failed tool call, an
interruption, a word-for-word retry, a user saying the reply was wrong or right), and each
counts by its client key's weight (learner/signals.py, `learn --signal-weight`). Each reply
scores 0.5 (nothing known), moved towards 0 by a bad signal and towards 1 by a good one as
far as its weight says; the reward is the mean over the trajectory's replies, and the detail
lists the signals (weight 0 included), with their evidence (the learner's per-turn credit,
`--credit turn`, trains each judged reply on its own signal instead). With `next_turn:judge`, a
judge (learner/graders/turn_judge.py) also judges the replies the rules are silent on that
the user answered, with that answer in view. A trajectory with no reply, or all of whose
calls came with a key whose signals are off, is an error: nothing to judge, or nothing that
may count. Combine it with the judge (`--grader next_turn --grader
judge`) to have the whole trajectory judged as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import openai

from learner.graders.base import Grade
from learner.signals import SignalWeights, as_detail, signals_off, weighed_signals
from store.conversation import conversation
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

if TYPE_CHECKING:
    from learner.graders.turn_judge import TurnJudge


class NextTurnGrader:
    def __init__(
        self, weights: SignalWeights | None = None, judge: TurnJudge | None = None
    ) -> None:
        self.weights = weights or SignalWeights()
        self.judge = judge
        self.name = "next_turn:judge" if judge is not None else "next_turn"

    def close(self) -> None:
        if self.judge is not None:
            self.judge.close()

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: Trajectory) -> Grade:
        messages = conversation(trajectory.calls)
        # one reply per call (a Responses call may give several assistant messages)
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
        try:
            signals = weighed_signals(trajectory, self.weights, self.judge)
        except (openai.OpenAIError, httpx.HTTPError) as exc:
            return Grade.of_exception(f"turn judge: {exc}", exc)
        value = {s.call_id: s.value * s.weight for s in signals}
        scores = [min(1.0, max(0.0, 0.5 + 0.5 * value.get(r, 0.0))) for r in replies]
        return Grade(
            reward=sum(scores) / len(scores),
            detail={"replies": len(replies), "signals": as_detail(signals)},
        )
