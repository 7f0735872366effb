"""Hand-made trajectories (store/trajectory_record.py), one call per API shape."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from store.trajectory_record import Trajectory, TrajectoryCall

_ids = itertools.count(1)
QUESTION = "What is 6 times 7?"
STARTED = datetime(2026, 1, 1, tzinfo=UTC)
ENDED = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def _call(api: str, request: dict[str, Any], response: dict[str, Any] | None) -> TrajectoryCall:
    return TrajectoryCall(
        id=f"call-{next(_ids)}",
        api=api,
        model="tiny",
        upstream="http://127.0.0.1:8000",
        policy_version="0",
        status="ok" if response is not None else "error",
        http_status=200 if response is not None else 502,
        error=None if response is not None else "upstream unavailable",
        stream=False,
        started_at=STARTED,
        request=request,
        response=response,
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        completion_logprobs=[-0.5, -0.25],
        finish_reason="stop",
        capture_complete=True,
        latency_ms=12.0,
    )


def chat_call(answer: str | None, *, question: str = QUESTION) -> TrajectoryCall:
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


def responses_call(answer: str, *, question: str = QUESTION) -> TrajectoryCall:
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


def messages_call(answer: str, *, question: str = QUESTION) -> TrajectoryCall:
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


def completions_call(answer: str, *, question: str = QUESTION) -> TrajectoryCall:
    request = {"model": "tiny", "prompt": question}
    response = {"object": "text_completion", "choices": [{"index": 0, "text": answer}]}
    return _call("completions", request, response)


def failed_call() -> TrajectoryCall:
    return _call("chat.completions", {"model": "tiny", "messages": []}, None)


def trajectory(
    *calls: TrajectoryCall,
    task_key: str | None = "mul",
    session: str | None = None,
    interaction_type: str | None = None,
    ended_at: datetime | None = ENDED,
) -> Trajectory:
    return Trajectory(
        id=f"traj-{next(_ids)}",
        calls=calls,
        session=session,
        task_key=task_key,
        interaction_type=interaction_type,
        status="finished",
        started_at=STARTED,
        ended_at=ended_at,
    )


def answered(answer: str, *, task_key: str | None = "mul") -> Trajectory:
    """A one-call chat trajectory whose final answer is `answer`."""
    return trajectory(chat_call(answer), task_key=task_key)
