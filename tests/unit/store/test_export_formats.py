"""TRL rows from recorded trajectories, whatever API their calls spoke (pure)."""

from __future__ import annotations

from typing import Any

from store.export_formats import trl_rows
from store.trajectory_record import Trajectory, TrajectoryCall


def call(cid: str, api: str, request: dict[str, Any], response: dict[str, Any]) -> TrajectoryCall:
    return TrajectoryCall(cid, api, request=request, response=response, policy_version="v1")


def trajectory(*calls: TrajectoryCall) -> Trajectory:
    return Trajectory("t", calls, task_key="k", interaction_type="x", reward=1.0)


def test_a_gemini_tool_loop_is_a_prompt_with_the_tool_call_and_its_result() -> None:
    first = {
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "contents": [{"role": "user", "parts": [{"text": "write it"}]}],
    }
    called = {"functionCall": {"id": "c1", "name": "write_file", "args": {"path": "a"}}}
    reply = {"candidates": [{"content": {"role": "model", "parts": [called]}}]}
    second = {
        **first,
        "contents": [
            *first["contents"],
            {"role": "model", "parts": [called]},
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "id": "c1",
                            "name": "write_file",
                            "response": {"ok": True},
                        }
                    }
                ],
            },
        ],
    }
    done = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Done."}]}}]}
    [row] = trl_rows([trajectory(call("a", "gemini", first, reply),
                                 call("b", "gemini", second, done))])  # fmt: skip
    assert row["prompt"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "write_file", "arguments": {"path": "a"}}}
        ]},
        {"role": "tool", "content": '{"ok":true}'},
    ]  # fmt: skip
    assert row["completion"] == [{"role": "assistant", "content": "Done."}]
    assert row["reward"] == 1.0 and row["policy_versions"] == ["v1"]


def test_only_the_last_context_counts_and_a_trajectory_without_a_reply_is_left_out() -> None:
    chat = "chat.completions"

    def answer(text: str) -> dict[str, Any]:
        return {"choices": [{"message": {"role": "assistant", "content": text}}]}

    one = call("a", chat, {"messages": [{"role": "user", "content": "q1"}]}, answer("a1"))
    other = call("b", chat, {"messages": [{"role": "user", "content": "q2"}]}, answer("a2"))
    [row] = trl_rows([trajectory(one, other)])
    assert row["prompt"] == [{"role": "user", "content": "q2"}]
    assert row["completion"] == [{"role": "assistant", "content": "a2"}]
    refused = call("c", chat, {"messages": [{"role": "user", "content": "q"}]}, {"error": {}})
    assert list(trl_rows([trajectory(refused)])) == []
