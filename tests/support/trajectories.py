"""Hand-made trajectories in the export format (docs/reference/export-format.md), one per
API shape."""

from __future__ import annotations

import itertools
from typing import Any

_ids = itertools.count(1)
QUESTION = "What is 6 times 7?"


def _call(api: str, request: dict[str, Any], response: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": f"call-{next(_ids)}",
        "api": api,
        "model": "tiny",
        "upstream": "http://127.0.0.1:8000",
        "policy_version": 0,
        "status": "ok" if response is not None else "error",
        "http_status": 200 if response is not None else 502,
        "error": None if response is not None else "upstream unavailable",
        "stream": False,
        "started_at": "2026-01-01T00:00:00+00:00",
        "request": request,
        "response": response,
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "completion_logprobs": [-0.5, -0.25],
        "finish_reason": "stop",
        "capture_complete": True,
        "latency_ms": 12.0,
        "ttft_ms": None,
    }


def chat_call(answer: str | None, *, question: str = QUESTION) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    if answer is None:  # a reply that only calls a tool
        message["tool_calls"] = [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]
    request = {"model": "tiny", "messages": [{"role": "user", "content": question}]}
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    return _call("chat.completions", request, response)


def responses_call(answer: str, *, question: str = QUESTION) -> dict[str, Any]:
    request = {
        "model": "tiny",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": question}]}],
    }
    response = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            },
        ],
    }
    return _call("responses", request, response)


def messages_call(answer: str, *, question: str = QUESTION) -> dict[str, Any]:
    request = {
        "model": "tiny",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [{"type": "text", "text": question}]}],
    }
    half = len(answer) // 2
    response = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [
            {"type": "text", "text": answer[:half]},
            {"type": "tool_use", "id": "tu_1", "name": "f", "input": {}},
            {"type": "text", "text": answer[half:]},
        ],
        "stop_reason": "end_turn",
    }
    return _call("messages", request, response)


def completions_call(answer: str, *, question: str = QUESTION) -> dict[str, Any]:
    request = {"model": "tiny", "prompt": question}
    response = {"object": "text_completion", "choices": [{"index": 0, "text": answer}]}
    return _call("completions", request, response)


def failed_call() -> dict[str, Any]:
    return _call("chat.completions", {"model": "tiny", "messages": []}, None)


def trajectory(
    *calls: dict[str, Any],
    task_key: str | None = "mul",
    session: str | None = None,
    ended_at: str | None = "2026-01-01T00:01:00+00:00",
) -> dict[str, Any]:
    return {
        "id": f"traj-{next(_ids)}",
        "session": session,
        "task_key": task_key,
        "status": "finished",
        "reward": None,
        "started_at": "2026-01-01T00:00:00+00:00",
        "ended_at": ended_at,
        "calls": list(calls),
    }


def answered(answer: str, *, task_key: str | None = "mul") -> dict[str, Any]:
    """A one-call chat trajectory whose final answer is `answer`."""
    return trajectory(chat_call(answer), task_key=task_key)
