"""How every learning figure a bench prints is summarised: over seeds, with a 95% interval.

The rules (issue 42): a learning result is measured on held-out prompts, over at least 3
seeds that no setting was chosen on, printed as their mean with a 95% interval and the seeds
named, every arm printed. `Summary` is that figure; `summarise` makes one from per-seed
values, `seeds_are_fresh` tells whether the seeds were used to choose a setting.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom: a table, so that no
# bench needs scipy. Past 30 the normal's 1.96 is within 2%.
_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
}  # fmt: skip

MIN_SEEDS = 3  # fewer seeds than this make no learning figure


def t_quantile(degrees: int) -> float:
    """The 0.975 quantile of Student's t with `degrees` degrees of freedom (>= 1)."""
    if degrees < 1:
        raise ValueError("a t interval needs at least two values")
    return _T975.get(degrees, 1.96)


@dataclass(frozen=True)
class Summary:
    """Per-seed values of one figure: their mean and a 95% t interval around it."""

    values: tuple[float, ...]
    seeds: tuple[int, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def half_width(self) -> float:
        """Half the 95% interval; nan for fewer than two values (no spread to measure)."""
        if len(self.values) < 2:
            return math.nan
        sd = statistics.stdev(self.values)
        return t_quantile(len(self.values) - 1) * sd / math.sqrt(len(self.values))

    @property
    def interval(self) -> tuple[float, float]:
        return self.mean - self.half_width, self.mean + self.half_width

    @property
    def enough_seeds(self) -> bool:
        return len(self.values) >= MIN_SEEDS

    def format(self, spec: str = ".3f") -> str:
        """E.g. "0.412 [0.301, 0.523] (seeds 3, 4, 5)"; "(1 seed: no interval)" below two."""
        seeds = ", ".join(str(s) for s in self.seeds)
        if len(self.values) < 2:
            return f"{self.mean:{spec}} (seed {seeds}: no interval)"
        lo, hi = self.interval
        text = f"{self.mean:{spec}} [{lo:{spec}}, {hi:{spec}}] (seeds {seeds})"
        if not self.enough_seeds:
            text += f" -- fewer than {MIN_SEEDS} seeds: not a learning figure"
        return text


def summarise(values: Sequence[float], seeds: Sequence[int]) -> Summary:
    """The Summary of `values`, one per seed in `seeds` (same order)."""
    if len(values) != len(seeds):
        raise ValueError(f"{len(values)} values for {len(seeds)} seeds")
    if not values:
        raise ValueError("no values to summarise")
    return Summary(tuple(float(v) for v in values), tuple(int(s) for s in seeds))


def seeds_are_fresh(seeds: Iterable[int], tuned_on: Iterable[int]) -> bool:
    """True when none of `seeds` was used to choose a setting (`tuned_on`)."""
    return not set(seeds) & set(tuned_on)


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound at 0 of n, unlike the normal
    approximation's, which collapses to a point)."""
    if trials < 1:
        raise ValueError("no trials")
    share = successes / trials
    scale = 1 + z * z / trials
    centre = (share + z * z / (2 * trials)) / scale
    half = z * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)
