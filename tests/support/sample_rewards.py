"""Reward functions for the python grader's tests (imported by module path)."""

from __future__ import annotations

from typing import Any


def answer_length(trajectory: dict[str, Any]) -> float:
    content = trajectory["calls"][-1]["response"]["choices"][0]["message"]["content"]
    return float(len(content))


def is_finished(trajectory: dict[str, Any]) -> bool:
    return trajectory["status"] == "finished"


def vandal(trajectory: dict[str, Any]) -> int:
    for call in trajectory["calls"]:
        call["request"].clear()  # the bodies are the record's own: it must get a copy
    trajectory["calls"].clear()
    return 1


def explodes(trajectory: dict[str, Any]) -> float:
    raise RuntimeError("reward function broke")


def not_a_number(trajectory: dict[str, Any]) -> Any:
    return "high"


def not_finite(trajectory: dict[str, Any]) -> float:
    return float("nan")


def quits(trajectory: dict[str, Any]) -> float:
    raise SystemExit(2)


class Scorer:
    @staticmethod
    def constant(trajectory: dict[str, Any]) -> float:
        return 0.25


NOT_CALLABLE = 3


def unreachable(trajectory: dict[str, Any]) -> float:
    raise ConnectionRefusedError("the reward service is down")


def not_now(trajectory: dict[str, Any]) -> float:
    from learner.graders.base import TransientGradingError

    raise TransientGradingError("ask me later")


SERVICE_UP = {"up": False}  # a test flips it: the "reward service" comes back


def flaky(trajectory: dict[str, Any]) -> float:
    if not SERVICE_UP["up"]:
        raise ConnectionRefusedError("the reward service is down")
    return 0.75


SEEN: list[str] = []  # the trajectories `recorded` was asked to grade, in order


def recorded(trajectory: dict[str, Any]) -> float:
    SEEN.append(str(trajectory["id"]))
    return 0.5


RECEIVED: list[dict[str, Any]] = []  # what `keeps` was handed, in order


def keeps(trajectory: dict[str, Any]) -> float:
    RECEIVED.append(trajectory)
    return 1.0
