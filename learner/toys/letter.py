"""The letter toy's reward (bench/learning_per_step.py, and the learning tests): the share of
the letter 'a' in a reply, a property a tiny random model can learn quickly.

Its prompts: ``PROMPTS`` are the ones the benches train on; ``HELDOUT_PROMPTS`` are never
sent to a learner (disjoint from ``PROMPTS`` and from organic_traffic's "Write something,
take <n>."), so a learning figure is measured on them (issue 42)."""

from __future__ import annotations

from typing import Any

PROMPTS = [f"Write something, take {i}." for i in range(8)]
HELDOUT_PROMPTS = [f"Tell me anything at all, try {i}." for i in range(8)]


def reply_text(trajectory: dict[str, Any]) -> str:
    response = trajectory["calls"][-1]["response"] or {}
    choices = response.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("content") or ""


def share_of_a(text: str) -> float:
    return text.count("a") / len(text) if text else 0.0


def share_of_a_reward(trajectory: dict[str, Any]) -> float:
    """Python grader (python:learner.toys.letter:share_of_a_reward)."""
    return share_of_a(reply_text(trajectory))
