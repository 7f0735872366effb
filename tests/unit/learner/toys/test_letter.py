"""learner/toys/letter.py: the letter toy's reward, the share of 'a' in the last reply, and
its held-out prompts."""

from __future__ import annotations

import dataclasses

import pytest

from learner.toys.letter import (
    HELDOUT_PROMPTS,
    PROMPTS,
    reply_text,
    share_of_a,
    share_of_a_reward,
)
from store.export import to_export
from store.trajectory_record import TrajectoryCall
from tests.support.trajectories import chat_call, failed_call, trajectory


@pytest.mark.parametrize(
    ("text", "share"),
    [
        ("aaaa", 1.0),
        ("abab", 0.5),
        ("banana", 0.5),
        ("xyz", 0.0),
        ("AAAA", 0.0),  # the lowercase letter only
        ("a a ", 0.5),  # spaces count in the length
        ("", 0.0),  # no reply: no share, not a division by zero
    ],
)
def test_the_share_of_a(text: str, share: float) -> None:
    assert share_of_a(text) == share


def test_the_reward_reads_the_last_calls_reply() -> None:
    export = to_export(trajectory(chat_call("bbbb"), chat_call("aab a")))
    assert reply_text(export) == "aab a"
    assert share_of_a_reward(export) == 0.6


@pytest.mark.parametrize(
    "last",
    [
        failed_call(),  # no response recorded
        chat_call(None),  # a reply with only a tool call: content None
        dataclasses.replace(chat_call("aaa"), response={"choices": []}),
        dataclasses.replace(chat_call("aaa"), response={"choices": [{"index": 0}]}),
    ],
    ids=["failed", "tool call", "no choices", "no message"],
)
def test_a_last_call_without_text_is_rewarded_0(last: TrajectoryCall) -> None:
    export = to_export(trajectory(chat_call("aaaa"), last))
    assert reply_text(export) == "" and share_of_a_reward(export) == 0.0


def test_the_held_out_prompts_are_never_the_trained_ones() -> None:
    assert len(set(PROMPTS)) == len(set(HELDOUT_PROMPTS)) == 8
    assert not set(PROMPTS) & set(HELDOUT_PROMPTS)
    # nor organic traffic's "Write something, take <n>." for any n
    assert not any(p.startswith("Write something, take") for p in HELDOUT_PROMPTS)
