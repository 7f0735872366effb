"""The letter toy's reward (bench/learning_per_step.py, and the learning tests): the share of
the letter 'a' in a reply, a property a tiny random model can learn quickly."""

from __future__ import annotations

from typing import Any


def reply_text(trajectory: dict[str, Any]) -> str:
    response = trajectory["calls"][-1]["response"] or {}
    choices = response.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("content") or ""


def share_of_a(text: str) -> float:
    return text.count("a") / len(text) if text else 0.0


def share_of_a_reward(trajectory: dict[str, Any]) -> float:
    """Python grader (python:bench.letter_toy:share_of_a_reward)."""
    return share_of_a(reply_text(trajectory))
