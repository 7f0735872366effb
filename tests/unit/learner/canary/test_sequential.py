"""The canary's sequential test (learner/canary/sequential.py): looked at after every value,
it says "better" or "worse" where the arms do not differ at most alpha of the time, over many
simulated streams (seeded: the same streams every run); and it finds a real difference."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from learner.canary.sequential import Comparison, Rule, Verdict

STREAMS = 400
LENGTH = 600


def verdicts(
    draw: object, *, share: float, rule: Rule, seed: int, streams: int = STREAMS
) -> Counter[Verdict]:
    """The first verdict of each stream (UNDECIDED: none in LENGTH values), looking after
    every value; `draw(rng, canary)` is one value of an arm."""
    rng = random.Random(seed)
    found: Counter[Verdict] = Counter()
    for _ in range(streams):
        comparison = Comparison(rule)
        verdict = Verdict.UNDECIDED
        for _ in range(LENGTH):
            canary = rng.random() < share
            comparison.add(canary=canary, value=draw(rng, canary))  # type: ignore[operator]
            verdict = comparison.verdict()
            if verdict is not Verdict.UNDECIDED:
                break
        found[verdict] += 1
    return found


def bernoulli(p_canary: float, p_incumbent: float) -> object:
    return lambda rng, canary: float(rng.random() < (p_canary if canary else p_incumbent))


@pytest.mark.parametrize(
    ("name", "draw", "share", "seed"),
    [
        ("rewards near 0.3, half the traffic", bernoulli(0.3, 0.3), 0.5, 11),
        ("a rare event (5%), a tenth of the traffic", bernoulli(0.05, 0.05), 0.1, 12),
        ("rewards near 0.9", bernoulli(0.9, 0.9), 0.5, 13),
        ("latencies, the canary's noisier", lambda r, c: r.gauss(1.0, 0.4 if c else 0.2), 0.2, 14),
        ("the canary's quieter", lambda r, c: r.gauss(1.0, 0.1 if c else 0.4), 0.2, 15),
    ],
)
def test_where_the_arms_do_not_differ_a_verdict_comes_at_most_alpha_of_the_time(
    name: str, draw: object, share: float, seed: int
) -> None:
    rule = Rule(alpha=0.05, tau=0.1)
    found = verdicts(draw, share=share, rule=rule, seed=seed)
    wrong = found[Verdict.BETTER] + found[Verdict.WORSE]
    assert wrong / STREAMS <= rule.alpha, (name, found)


def test_a_real_difference_is_found_in_the_right_direction() -> None:
    worse = verdicts(bernoulli(0.3, 0.5), share=0.5, rule=Rule(), seed=1, streams=100)
    assert worse[Verdict.WORSE] >= 95 and worse[Verdict.BETTER] == 0
    better = verdicts(bernoulli(0.5, 0.3), share=0.5, rule=Rule(), seed=2, streams=100)
    assert better[Verdict.BETTER] >= 95 and better[Verdict.WORSE] == 0


def test_lower_is_better_turns_the_verdict() -> None:
    slower = Comparison(Rule(higher_is_better=False, tau=0.5))
    for i in range(200):
        slower.add(canary=True, value=2.0 + 0.1 * (i % 3))
        slower.add(canary=False, value=1.0 + 0.1 * (i % 3))
    assert slower.verdict() is Verdict.WORSE and slower.difference == pytest.approx(1.0)
    assert "difference +1" in slower.summary() and slower.summary().endswith(": worse")


def test_no_verdict_before_each_arm_has_its_minimum() -> None:
    comparison = Comparison(Rule(min_samples=30))
    for _ in range(29):
        comparison.add(canary=True, value=0.0)
    for _ in range(500):
        comparison.add(canary=False, value=1.0)
    assert comparison.likelihood_ratio() > 1e6  # overwhelming, and still too few canary calls
    assert comparison.verdict() is Verdict.UNDECIDED
    comparison.add(canary=True, value=0.0)
    assert comparison.verdict() is Verdict.WORSE


@pytest.mark.parametrize("bad", [{"alpha": 0.0}, {"alpha": 1.0}, {"tau": 0.0}, {"min_samples": 1}])
def test_a_rule_that_cannot_work_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Rule(**bad)  # type: ignore[arg-type]
