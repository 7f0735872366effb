"""A batch of recorded rows as the writer hands them to the store."""

from __future__ import annotations


def call_batch(now: float) -> dict:
    trajectory = {
        "id": "t1",
        "session_key": "s",
        "status": "open",
        "started_at": now,
        "last_call_at": now,
    }
    call = {
        "id": "c1",
        "trajectory_id": "t1",
        "session_key": "s",
        "api": "chat.completions",
        "upstream": "http://u",
        "model": "m",
        "policy_version": "v1",
        "stream": False,
        "status": "ok",
        "http_status": 200,
        "error": None,
        "request": {"messages": [{"role": "user", "content": "héllo"}]},
        "response": {"choices": []},
        "prompt_parent_id": None,
        "prompt_prefix_len": 0,
        "prompt_token_suffix": [1, 2, 3],
        "prompt_len": 3,
        "choices": [{"index": 0, "token_ids": [4], "logprobs": [-0.5], "finish_reason": "stop"}],
        "finish_reason": "stop",
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "capture_complete": True,
        "continuation_hash": "abc",
        "started_at": now,
        "latency_ms": 1.5,
        "ttft_ms": None,
    }
    return {"trajectories": [trajectory], "calls": [call], "finished": []}
