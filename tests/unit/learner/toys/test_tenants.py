"""learner/toys/tenants.py: each tenant's reward, the two tenants of a toy at odds, and the
grader that picks the reward by the call's client key."""

from __future__ import annotations

import dataclasses

import pytest

from learner.toys.tenants import (
    FEWER_A,
    LOWER,
    MORE_A,
    NO,
    NOT_LOWER,
    REWARDS,
    SPLITS,
    TOYS,
    YES,
    reward_for,
    tenant_reward,
)
from store.export import to_export
from store.trajectory_record import TrajectoryCall
from tests.support.trajectories import chat_call, trajectory


def _call(text: str, key: str | None) -> TrajectoryCall:
    return dataclasses.replace(chat_call(text), key_name=key)


@pytest.mark.parametrize(
    ("tenant", "text", "reward"),
    [
        (MORE_A, "aaaa", 1.0),
        (MORE_A, "abab", 0.5),
        (MORE_A, "", 0.0),
        (FEWER_A, "aaaa", 0.0),
        (FEWER_A, "bbba", 0.75),
        (FEWER_A, "", 1.0),  # an empty reply has no 'a'
        (LOWER, "lower", 1.0),
        (LOWER, " Space first", 1.0),
        (LOWER, "Upper", 0.0),
        (LOWER, "\u00e9t\u00e9", 0.0),  # lowercase, but not ASCII
        (LOWER, "1st", 0.0),
        (LOWER, "", 0.0),
        (NOT_LOWER, "Upper", 1.0),
        (NOT_LOWER, "lower", 0.0),
        (NOT_LOWER, "", 1.0),
        (YES, "Yes.", 1.0),
        (YES, "  YES, of course", 1.0),
        (YES, "yes", 1.0),
        (YES, "yesterday", 0.0),  # the word, not its first letters
        (YES, "No", 0.0),
        (YES, "I'd say yes", 0.0),  # it must begin with it
        (YES, "", 0.0),
        (NO, "No!", 1.0),
        (NO, "no-brainer", 1.0),  # a hyphen ends the word
        (NO, "not really", 0.0),
        (NO, "nope", 0.0),
        (NO, "Yes", 0.0),
    ],
)
def test_each_tenants_reward(tenant: str, text: str, reward: float) -> None:
    assert reward_for(tenant, text) == reward


@pytest.mark.parametrize("text", ["Banana", "apple", " a", "", "Yes", "no way", "xyz"])
def test_the_two_tenants_of_a_toy_never_both_get_the_full_reward(text: str) -> None:
    assert set(REWARDS) == {tenant for pair in TOYS.values() for tenant in pair}
    for first, second in TOYS.values():
        assert reward_for(first, text) + reward_for(second, text) <= 1.0


def test_the_grader_rewards_by_the_last_calls_key() -> None:
    export = to_export(trajectory(_call("bbbb", FEWER_A), _call("aaab", MORE_A)))
    assert tenant_reward(export) == 0.75
    export = to_export(trajectory(_call("aaab", MORE_A), _call("Yes, sure", YES)))
    assert tenant_reward(export) == 1.0


@pytest.mark.parametrize("key", [None, "default", "more_a"])
def test_a_call_of_no_toy_tenant_is_an_error_not_a_zero(key: str | None) -> None:
    with pytest.raises(ValueError, match=f"a call of no toy tenant \\(key {key!r}\\)"):
        tenant_reward(to_export(trajectory(_call("aaaa", key))))


def test_no_measured_prompt_is_trained_on() -> None:
    assert set(SPLITS) == set(TOYS)
    for trained, held_out in SPLITS.values():
        assert len(held_out) == len(set(held_out)) == 8
        assert not set(trained) & set(held_out)
