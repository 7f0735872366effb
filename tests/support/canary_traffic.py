"""Graded traffic for the canary tests: single-call trajectories answered by one version, as
the proxy records them and the grader grades them, for the canary decisions and the
reward-hacking watch to read from the store."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import Engine

from store import grade_queue, recording
from store.turn_signals import Stored, save_signals


def serve(
    engine: Engine,
    tenant: str | None,
    version: str,
    rewards: Sequence[float | None],
    *,
    at: float,
    spacing: float = 1.0,
    first: int = 0,
    complaints: int = 0,
    approve_others: bool = False,
    text: str | None = None,
    tokens: int = 120,
    tool_arguments: str | None = None,
    judge: float | None = None,
) -> list[str]:
    """One single-call trajectory of `tenant` per reward, answered by `version`, graded
    (None: not graded); the i-th (numbered from `first`) at `at` + i x `spacing`. With
    `text`, the reply is recorded: `text` in `tokens` tokens (and a tool call with
    `tool_arguments`); with `judge`, a self-judge verdict beside the reward as its truth.
    The first `complaints` are corrected (the others approved with `approve_others`).
    Their ids."""
    trajectories, calls = [], []
    for i in range(first, first + len(rewards)):
        started = at + i * spacing
        tid = f"{tenant}-{version}-{i}"
        trajectories.append(
            {"id": tid, "status": "finished", "started_at": started, "last_call_at": started}
        )
        calls.append({
            "id": f"{tid}-c", "trajectory_id": tid, "session_key": tid,
            "api": "chat.completions", "status": "ok", "http_status": 200, "stream": False,
            "prompt_prefix_len": 0, "capture_complete": True, "started_at": started,
            "latency_ms": 100.0, "policy_version": version, "tenant": tenant,
        })  # fmt: skip
        if text is not None:
            calls[-1].update(
                response=_response(tid, text, tool_arguments), completion_tokens=tokens
            )
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=trajectories, calls=calls)
        for trajectory, reward in zip(trajectories, rewards, strict=True):
            if reward is None:
                continue
            grade_queue.save_grade(
                conn,
                trajectory_id=trajectory["id"],
                reward=reward,
                detail=_judged(judge, reward),
                error=None,
            )
        for n, trajectory in enumerate(trajectories):
            tid = trajectory["id"]
            if n < complaints:
                signal = Stored(f"{tid}-c", 0, -1.0, "corrected", "no, that is wrong", None)
            elif approve_others:
                signal = Stored(f"{tid}-c", 0, 1.0, "approved", "thanks", None)
            else:
                continue
            save_signals(conn, trajectory_id=tid, signals=[signal], now=datetime.now(UTC))
    return [t["id"] for t in trajectories]


def _response(tid: str, text: str, tool_arguments: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_arguments is not None:
        message["tool_calls"] = [{
            "id": f"{tid}-tool", "type": "function",
            "function": {"name": "edit", "arguments": tool_arguments},
        }]  # fmt: skip
    return {"choices": [{"index": 0, "message": message}]}


def _judged(judge: float | None, reward: float) -> dict[str, Any]:
    if judge is None:
        return {}
    return {
        "self_judge": {
            "type": None, "rubric": "default", "reward": judge, "detail": {},
            "shadow": True, "truth": {"source": "reference", "reward": reward},
        }
    }  # fmt: skip


def canary_sessions(proxy_url: str, model: str, n: int, api_key: str = "x") -> None:
    """`n` one-call sessions through the proxy, each under its own session key (a canary's
    unit): real calls, for the e2e tests."""
    with httpx.Client(base_url=proxy_url, timeout=120) as client:
        for i in range(n):
            answer = client.post(
                f"/s/canary-{i}/v1/chat/completions",
                headers={"Authorization": f"Bearer {api_key}"},
                json={"model": model, "messages": [{"role": "user", "content": f"Hi {i}."}],
                      "max_tokens": 4},
            )  # fmt: skip
            assert answer.status_code == 200, answer.text
