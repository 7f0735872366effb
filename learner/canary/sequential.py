"""An always-valid comparison of a canary version with the version it would replace.

The mixture sequential probability ratio test (mSPRT, with a normal mixing distribution;
Robbins 1970, as "always valid p-values" in Johari, Pekelis and Walsh 2017). The estimate
of the difference of the arms' means, D = mean(canary) - mean(incumbent), is taken as
normal around the true difference d with variance v = s_c^2 / n_c + s_i^2 / n_i, where
each arm's s^2 is the larger of its own variance and that of both arms' values together.
An arm's own variance alone misleads while the arm is small: a canary with 30 calls of a 5%
event has often seen none, and its variance of 0 made one test in five say "worse" where
nothing differed. The pooled one alone misleads where the arms' spreads differ (a noisier
canary on a fifth of the traffic: one test in six). Mixing
d over N(0, tau^2), the likelihood ratio of "some difference" against "none" is

    L = sqrt(v / (v + tau^2)) * exp(tau^2 * D^2 / (2 * v * (v + tau^2)))

Under "none", L is a non-negative martingale with mean 1, so the chance that it ever reaches
1 / alpha is at most alpha (Ville's inequality): the learner may look after every call and
stop at the first look where L >= 1 / alpha, and still be wrong at most alpha of the time.
The variance is estimated, so no look decides before `min_samples` in each arm, and it is
never taken below `min_variance` (values that have all been alike so far).

`tau` is the size of difference the test is tuned to find, in the measure's own units
(0.1 for a reward in [0, 1]): much smaller differences take long to show, much larger ones
are found a little later than a test tuned to them would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    UNDECIDED = "undecided"
    BETTER = "better"  # the canary is better on this measure
    WORSE = "worse"


@dataclass(frozen=True)
class Rule:
    """How one measure is compared: what counts as better, and how sure to be."""

    higher_is_better: bool = True
    alpha: float = 0.05  # the chance of a verdict where the arms do not differ, at most
    tau: float = 0.1  # the difference tuned for, in the measure's units
    min_samples: int = 30  # in each arm, before any verdict
    min_variance: float = 1e-4  # the variance is never taken below this

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), not {self.alpha}")
        if self.tau <= 0.0 or self.min_variance <= 0.0:
            raise ValueError("tau and min_variance must be positive")
        if self.min_samples < 2:
            raise ValueError("min_samples must be at least 2 (a variance needs two values)")


@dataclass
class Arm:
    """A running mean and variance (Welford), one value at a time."""

    n: int = 0
    mean: float = 0.0
    _m2: float = 0.0

    @classmethod
    def from_sums(cls, n: int, total: float, squares: float) -> Arm:
        """An arm of `n` values known by their sum and the sum of their squares (what the
        store aggregates), as if they had been added one at a time."""
        if n <= 0:
            return cls()
        mean = total / n
        return cls(n=n, mean=mean, _m2=max(squares - n * mean * mean, 0.0))

    def add(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        return self._m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass
class Comparison:
    """The canary's arm against the incumbent's on one measure, looked at any time."""

    rule: Rule = field(default_factory=Rule)
    canary: Arm = field(default_factory=Arm)
    incumbent: Arm = field(default_factory=Arm)
    both: Arm = field(default_factory=Arm)  # every value: the variance under "none"

    @classmethod
    def from_arms(cls, rule: Rule, canary: Arm, incumbent: Arm) -> Comparison:
        """The comparison of two arms known by their counts, means and variances."""
        n = canary.n + incumbent.n
        both = Arm()
        if n:
            mean = (canary.n * canary.mean + incumbent.n * incumbent.mean) / n
            m2 = (
                canary._m2
                + incumbent._m2
                + canary.n * (canary.mean - mean) ** 2
                + incumbent.n * (incumbent.mean - mean) ** 2
            )
            both = Arm(n=n, mean=mean, _m2=m2)
        return cls(rule=rule, canary=canary, incumbent=incumbent, both=both)

    def add(self, *, canary: bool, value: float) -> None:
        (self.canary if canary else self.incumbent).add(value)
        self.both.add(value)

    @property
    def difference(self) -> float:
        """The canary's mean minus the incumbent's."""
        return self.canary.mean - self.incumbent.mean

    def likelihood_ratio(self) -> float:
        """L above (1.0 before both arms have two values: no evidence either way)."""
        if self.canary.n < 2 or self.incumbent.n < 2:
            return 1.0
        pooled = max(self.both.variance, self.rule.min_variance)
        v = (
            max(self.canary.variance, pooled) / self.canary.n
            + max(self.incumbent.variance, pooled) / self.incumbent.n
        )
        tau2 = self.rule.tau**2
        exponent = tau2 * self.difference**2 / (2.0 * v * (v + tau2))
        return math.sqrt(v / (v + tau2)) * math.exp(min(exponent, 700.0))

    def verdict(self) -> Verdict:
        rule = self.rule
        if min(self.canary.n, self.incumbent.n) < rule.min_samples:
            return Verdict.UNDECIDED
        if self.likelihood_ratio() < 1.0 / rule.alpha:
            return Verdict.UNDECIDED
        ahead = self.difference > 0 if rule.higher_is_better else self.difference < 0
        return Verdict.BETTER if ahead else Verdict.WORSE

    def summary(self) -> str:
        """One line: each arm's mean and count, the difference, the evidence, the verdict."""
        return (
            f"canary {self.canary.mean:.4g} (n={self.canary.n}) vs incumbent "
            f"{self.incumbent.mean:.4g} (n={self.incumbent.n}): difference "
            f"{self.difference:+.4g}, likelihood ratio {self.likelihood_ratio():.3g} "
            f"(decides at {1.0 / self.rule.alpha:g}): {self.verdict()}"
        )
