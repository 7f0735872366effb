"""The next_turn grader: the share of replies the traffic did not judge bad."""

from __future__ import annotations

from typing import Any

from learner.graders import build_graders
from store.tasks import TaskTable


def chat_call(cid: str, messages: list[dict[str, Any]], reply: str) -> dict[str, Any]:
    response = {"choices": [{"message": {"role": "assistant", "content": reply}}]}
    return {"id": cid, "api": "chat.completions", "request": {"messages": messages},
            "response": response, "error": None}  # fmt: skip


def test_a_retried_reply_halves_a_two_reply_trajectory() -> None:
    asked = [{"role": "user", "content": "6 x 7?"}]
    again = [*asked, {"role": "assistant", "content": "43"}, {"role": "user", "content": "6 x 7?"}]
    retried = {"id": "t1", "calls": [chat_call("a", asked, "43"), chat_call("b", again, "42")]}
    fine = {"id": "t2", "calls": [chat_call("c", asked, "42")]}
    empty = {"id": "t3", "calls": []}
    grader = build_graders(["next_turn"])
    first, second, third = grader.grade([retried, fine, empty], tasks=TaskTable())
    assert first.reward == 0.5
    [signal] = first.detail["next_turn"]["detail"]["signals"]
    assert (signal["call_id"], signal["rule"]) == ("a", "retried")
    assert second.reward == 1.0 and second.error is None
    assert third.reward is None and "no reply" in (third.error or "")
