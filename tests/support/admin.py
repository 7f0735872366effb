"""The admin API's token and a seeded store: what the admin and dashboard tests share."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from store import grade_queue, recording

TOKEN = "admin-secret-token"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


N = 23  # more than one page of PAGE


def chat_call(
    call_id: str,
    trajectory_id: str,
    *,
    started: float,
    prompt: list[int],
    completion: list[int],
    messages: list[dict[str, Any]],
    reply: str,
    version: str,
    status: str = "ok",
    latency_ms: float = 100.0,
    parent: str | None = None,
    prefix_len: int = 0,
) -> dict[str, Any]:
    """A chat-completions call row as the recorder writes it."""
    ok = status == "ok"
    return {
        "id": call_id,
        "trajectory_id": trajectory_id,
        "session_key": None,
        "api": "chat.completions",
        "upstream": "http://vllm:8000",
        "model": "tiny",
        "policy_version": version,
        "stream": False,
        "status": status,
        "http_status": 200 if ok else 502,
        "error": None if ok else "upstream unreachable",
        "request": {"model": "tiny", "messages": messages},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
        "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}
        if ok
        else None,
        "prompt_parent_id": parent,
        "prompt_prefix_len": prefix_len,
        "prompt_token_suffix": prompt[prefix_len:],
        "prompt_len": len(prompt),
        "choices": [
            {
                "index": 0,
                "token_ids": completion,
                "logprobs": [-0.5] * len(completion),
                "finish_reason": "stop",
                "capture_complete": True,
            }
        ],
        "finish_reason": "stop",
        "prompt_tokens": len(prompt),
        "completion_tokens": len(completion),
        "capture_complete": ok,
        "continuation_hash": None,
        "started_at": started,
        "latency_ms": latency_ms,
        "ttft_ms": None,
    }


def kind_of(i: int) -> str:
    """Seeded trajectory i's interaction type: both versions serve both types."""
    return "kind-a" if i % 4 < 2 else "auto:agent:0123456789ab"


def seed(engine: Engine, n: int = N, *, now: float | None = None) -> list[dict[str, Any]]:
    """n two-turn trajectories, 10 minutes apart, newest first in the returned list.

    Trajectory i: session "s{i}", task "task-{i % 3}", version v{i % 2}, reward i/n when
    i is even (graded), interaction type `kind_of(i)`, the last one open; call 2 of
    trajectory 4 failed.
    """
    now = now or time.time()
    made = []
    with engine.begin() as conn:
        for i in range(n):
            started = now - (n - i) * 600
            tid = f"traj{i:03d}"
            first_prompt = [1, 2, 3, 10 + i]
            first_completion = [20, 21, 22]
            second_prompt = [*first_prompt, *first_completion, 4, 5]
            messages = [{"role": "user", "content": f"question number {i}"}]
            follow_up = [
                *messages,
                {"role": "assistant", "content": f"answer {i}"},
                {"role": "user", "content": "and then?"},
            ]
            calls = [
                chat_call(
                    f"c{i:03d}a",
                    tid,
                    started=started,
                    prompt=first_prompt,
                    completion=first_completion,
                    messages=messages,
                    reply=f"answer {i}",
                    version=f"v{i % 2}",
                    latency_ms=100.0 + i,
                ),
                chat_call(
                    f"c{i:03d}b",
                    tid,
                    started=started + 1,
                    prompt=second_prompt,
                    completion=[30, 31],
                    messages=follow_up,
                    reply="the end",
                    version=f"v{i % 2}",
                    status="error" if i == 4 else "ok",
                    latency_ms=1000.0 + i,
                    parent=f"c{i:03d}a",
                    prefix_len=len(first_prompt) + len(first_completion),
                ),
            ]
            trajectory = {
                "id": tid,
                "session_key": f"s{i}",
                "task_key": f"task-{i % 3}",
                "group_key": None,
                "interaction_type": kind_of(i),
                "status": "open",
                "started_at": started,
                "last_call_at": started + 1,
                "ended_at": None,
            }
            finished = [] if i == n - 1 else [{"id": tid, "ended_at": started + 2}]
            recording.write_batch(conn, trajectories=[trajectory], calls=calls, finished=finished)
            if i % 2 == 0 and i != n - 1:
                grade_queue.save_grade(
                    conn, trajectory_id=tid, reward=i / n, detail={"grader": "test"}, error=None
                )
            made.append({"id": tid, "started": started, "reward": i / n if i % 2 == 0 else None})
    return list(reversed(made))
