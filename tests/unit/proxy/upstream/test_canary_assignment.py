"""The canary's assignment (proxy/upstream/canary_assignment.py): sticky per key, the share
held over many keys, independent between canaries; the key is the session, else the
conversation's opening, which every later call of the conversation repeats."""

from __future__ import annotations

import math

import pytest

from proxy.upstream.canary_assignment import in_candidate_arm

SESSIONS = [f"s:session-{i}" for i in range(20_000)]


def test_a_key_always_gets_the_same_arm() -> None:
    first = [in_candidate_arm(7, key, 0.3) for key in SESSIONS[:500]]
    again = [in_candidate_arm(7, key, 0.3) for key in SESSIONS[:500]]
    assert first == again


@pytest.mark.parametrize("share", [0.01, 0.1, 0.5, 0.9])
def test_the_share_holds_over_many_sessions(share: float) -> None:
    got = sum(in_candidate_arm(3, key, share) for key in SESSIONS) / len(SESSIONS)
    # 4 binomial standard deviations: a wrong split fails, chance does not
    assert abs(got - share) < 4 * math.sqrt(share * (1 - share) / len(SESSIONS))


def test_a_larger_share_keeps_every_session_the_smaller_one_had() -> None:
    """Raising the share only moves incumbent sessions over: none goes back."""
    small = {key for key in SESSIONS if in_candidate_arm(5, key, 0.1)}
    large = {key for key in SESSIONS if in_candidate_arm(5, key, 0.3)}
    assert small < large


def test_each_canary_draws_its_own_sessions() -> None:
    one = {key for key in SESSIONS if in_candidate_arm(1, key, 0.5)}
    two = {key for key in SESSIONS if in_candidate_arm(2, key, 0.5)}
    both = len(one & two) / len(SESSIONS)
    assert abs(both - 0.25) < 0.02  # independent halves overlap on a quarter


def test_the_edges_of_the_share() -> None:
    assert not any(in_candidate_arm(1, key, 0.0) for key in SESSIONS[:1000])
    assert all(in_candidate_arm(1, key, 1.0) for key in SESSIONS[:1000])
