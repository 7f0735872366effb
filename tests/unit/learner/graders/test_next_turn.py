"""The next_turn grader: each reply 0.5, 0 when the traffic judged it bad, 1 when good."""

from __future__ import annotations

from typing import Any

from learner.graders import build_graders
from store.tasks import TaskTable
from store.trajectory_record import Trajectory, TrajectoryCall


def chat_call(cid: str, messages: list[dict[str, Any]], reply: str) -> TrajectoryCall:
    response = {"choices": [{"message": {"role": "assistant", "content": reply}}]}
    return TrajectoryCall(
        cid, "chat.completions", request={"messages": messages}, response=response
    )


def test_each_reply_scores_by_its_signal_and_silence_is_half() -> None:
    asked = [{"role": "user", "content": "6 x 7?"}]
    again = [*asked, {"role": "assistant", "content": "43"}, {"role": "user", "content": "6 x 7?"}]
    retried = Trajectory("t1", (chat_call("a", asked, "43"), chat_call("b", again, "42")))
    fine = Trajectory("t2", (chat_call("c", asked, "42"),))
    empty = Trajectory("t3")
    grader = build_graders(["next_turn"])
    first, second, third = grader.grade([retried, fine, empty], tasks=TaskTable())
    assert first.reward == 0.25  # (0 + 0.5) / 2: a bad reply and one nothing was said of
    [signal] = first.detail["next_turn"]["detail"]["signals"]
    assert (signal["call_id"], signal["rule"]) == ("a", "retried")
    assert second.reward == 0.5 and second.error is None
    reply = {"role": "assistant", "content": "42"}
    thanked = [*asked, reply, {"role": "user", "content": "Thanks!"}]
    approved = Trajectory("t4", (chat_call("d", asked, "42"), chat_call("e", thanked, "np")))
    [fourth] = grader.grade([approved], tasks=TaskTable())
    assert fourth.reward == 0.75
    assert third.reward is None and "no reply" in (third.error or "")
