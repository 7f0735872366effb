"""The learner's decision on a canary (learner/canary/decide.py) from its arms' sums, as the
store gives them: roll back on any worse measure (a better reward included), promote on a
better reward, wait before the minimum, take the default at the time limit."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from learner.canary.decide import decide
from learner.canary.sequential import Arm, Comparison
from learner.canary.watch import Alert

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def canary(**overrides: Any) -> dict[str, Any]:
    found = {"min_calls": 30, "ends_at": NOW + timedelta(hours=1), "default_decision": "rollback"}
    return found | overrides


def arm(
    rewards: list[float], *, calls: int | None = None, errors: int = 0, complaints: int = 0
) -> dict[str, Any]:
    return {
        "calls": len(rewards) if calls is None else calls,
        "errors": errors,
        "graded": len(rewards),
        "reward_sum": sum(rewards),
        "reward_squares": sum(r * r for r in rewards),
        "signals": {"negative": complaints, "positive": 0, "negative_by_rule": {}},
    }


def bernoulli(p: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [1.0 if rng.random() < p else 0.0 for _ in range(n)]


def test_the_sums_give_the_same_test_as_the_values_one_at_a_time() -> None:
    candidate, incumbent = bernoulli(0.6, 80, 1), bernoulli(0.4, 120, 2)
    one_by_one = Comparison()
    for value in candidate:
        one_by_one.add(canary=True, value=value)
    for value in incumbent:
        one_by_one.add(canary=False, value=value)
    from_sums = Comparison.from_arms(
        one_by_one.rule,
        Arm.from_sums(len(candidate), sum(candidate), sum(v * v for v in candidate)),
        Arm.from_sums(len(incumbent), sum(incumbent), sum(v * v for v in incumbent)),
    )
    assert from_sums.both.n == one_by_one.both.n
    assert from_sums.both.variance == pytest.approx(one_by_one.both.variance)
    assert from_sums.likelihood_ratio() == pytest.approx(one_by_one.likelihood_ratio())


def test_a_clearly_better_reward_is_promoted() -> None:
    arms = {"candidate": arm(bernoulli(0.8, 200, 1)), "incumbent": arm(bernoulli(0.3, 200, 2))}
    decision = decide(canary(), arms, now=NOW)
    assert decision is not None and decision.action == "promote"
    assert "reward is better" in decision.reason


def test_a_better_reward_with_more_complaints_is_rolled_back() -> None:
    # the reward-hacking shape: the grader is pleased, the users are not
    arms = {
        "candidate": arm(bernoulli(0.8, 200, 1), complaints=60),
        "incumbent": arm(bernoulli(0.3, 200, 2), complaints=10),
    }
    decision = decide(canary(), arms, now=NOW)
    assert decision is not None and decision.action == "rollback"
    assert "complaints" in decision.reason


def test_more_errors_roll_back() -> None:
    same = bernoulli(0.5, 200, 1)
    arms = {"candidate": arm(same, errors=40), "incumbent": arm(same, errors=2)}
    decision = decide(canary(), arms, now=NOW)
    assert decision is not None and decision.action == "rollback"
    assert "errors" in decision.reason


def test_nothing_is_decided_before_the_minimum_even_on_a_wide_gap() -> None:
    arms = {"candidate": arm([1.0] * 20), "incumbent": arm([0.0] * 20)}
    assert decide(canary(min_calls=30), arms, now=NOW) is None


@pytest.mark.parametrize("default", ["promote", "rollback"])
def test_at_the_time_limit_the_default_decision_is_taken(default: str) -> None:
    alike = {"candidate": arm(bernoulli(0.5, 40, 1)), "incumbent": arm(bernoulli(0.5, 40, 2))}
    running = canary(default_decision=default, ends_at=NOW)
    assert decide(canary(), alike, now=NOW) is None
    decision = decide(running, alike, now=NOW)
    assert decision is not None and decision.action == default
    assert "time limit" in decision.reason


def test_alike_arms_are_rarely_decided() -> None:
    # the same reward, errors and complaints in both arms: a verdict is a false one
    decided = 0
    for seed in range(200):
        arms = {
            "candidate": arm(bernoulli(0.5, 150, 2 * seed), complaints=15),
            "incumbent": arm(bernoulli(0.5, 300, 2 * seed + 1), complaints=30),
        }
        decided += decide(canary(), arms, now=NOW) is not None
    assert decided <= 200 * 0.05


COLLAPSE = Alert("reply length collapsing", "median reply 120 -> 8 tokens (0.07x)")


def test_a_watch_alert_holds_a_promotion_and_names_the_alert() -> None:
    arms = {"candidate": arm(bernoulli(0.8, 200, 1)), "incumbent": arm(bernoulli(0.3, 200, 2))}
    decision = decide(canary(), arms, now=NOW, alerts=[COLLAPSE])
    assert decision is not None and decision.action == "hold"
    assert "reward is better" in decision.reason and COLLAPSE.reason in decision.reason


def test_a_watch_alert_never_holds_a_rollback_nor_decides_alike_arms() -> None:
    worse = {
        "candidate": arm(bernoulli(0.3, 200, 1)),
        "incumbent": arm(bernoulli(0.8, 200, 2)),
    }
    decision = decide(canary(), worse, now=NOW, alerts=[COLLAPSE])
    assert decision is not None and decision.action == "rollback"
    alike = {"candidate": arm(bernoulli(0.5, 40, 1)), "incumbent": arm(bernoulli(0.5, 40, 2))}
    assert decide(canary(), alike, now=NOW, alerts=[COLLAPSE]) is None


@pytest.mark.parametrize("better", [True, False])
def test_at_the_time_limit_a_held_or_default_promotion_is_rolled_back(better: bool) -> None:
    arms = (
        {"candidate": arm(bernoulli(0.8, 200, 1)), "incumbent": arm(bernoulli(0.3, 200, 2))}
        if better
        else {"candidate": arm(bernoulli(0.5, 40, 1)), "incumbent": arm(bernoulli(0.5, 40, 2))}
    )
    ended = canary(default_decision="promote", ends_at=NOW)
    decision = decide(ended, arms, now=NOW, alerts=[COLLAPSE])
    assert decision is not None and decision.action == "rollback"
    assert "held its promotion" in decision.reason and COLLAPSE.reason in decision.reason
    # without the alert: promoted, by the test or by the default
    decision = decide(ended, arms, now=NOW)
    assert decision is not None and decision.action == "promote"
