"""GRPO groups and advantages from graded trajectories (pure Python).

Invariant: every input sample is accounted for exactly once -- either it comes back with an
advantage or it is counted in one ``dropped_*`` metric -- and nothing that carries no learning
signal (stale, flat group, singleton without a baseline) comes back, so the trainer's global
token count only ever covers tokens that move the policy.

Rules, in order:
1. Samples produced more than ``max_staleness`` versions before the current one are dropped.
2. The rest are grouped by ``group_id`` (fan-out, rollout runner) or else by ``task_key``.
3. A group of at least ``min_group_size``: advantage = reward - group mean; if all its
   rewards are equal it carries no signal and is dropped whole.
4. A smaller group (a singleton by default): each sample's advantage = reward - the task's
   running baseline as it stood BEFORE this batch; no baseline yet -> dropped (its reward only
   seeds the baseline); an advantage of exactly 0 is dropped as flat, like a flat group.
5. Optionally all kept advantages are divided by their batch standard deviation.
6. Every non-stale reward then updates its task's running baseline, in input order.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

# Rewards closer than this are "equal": subtracting a mean leaves only rounding noise.
FLAT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Scored:
    trajectory_id: str
    task_key: str
    reward: float
    version_index: int  # ordinal of the policy version that produced it (higher = newer)
    group_id: str | None = None  # explicit group (fan-out / rollout); else grouped by task_key


@dataclass(frozen=True)
class GroupingConfig:
    max_staleness: int = 4  # drop samples produced more than this many versions ago
    std_normalise: bool = False  # divide all advantages by their batch std
    min_group_size: int = 2  # smaller groups fall back to the per-task running baseline

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        # A group of one always has advantage 0 against its own mean.
        if self.min_group_size < 2:
            raise ValueError(f"min_group_size must be >= 2, got {self.min_group_size}")


@dataclass(frozen=True)
class Advantaged:
    trajectory_id: str
    advantage: float
    group: str  # "group:<group_id>" or "task:<task_key>": the two namespaces never collide


class RunningBaselines:
    """Per-task exponential moving average of rewards: the baseline for singletons, which have
    no group mean. The first reward of a task seeds its baseline as is."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self._values: dict[str, float] = {}

    def get(self, task_key: str) -> float | None:
        return self._values.get(task_key)

    def update(self, task_key: str, reward: float) -> None:
        previous = self._values.get(task_key)
        if previous is None:
            self._values[task_key] = reward
        else:
            self._values[task_key] = self.decay * previous + (1.0 - self.decay) * reward

    def state(self) -> dict[str, float]:
        return dict(self._values)

    @classmethod
    def from_state(cls, state: Mapping[str, float], decay: float = 0.9) -> RunningBaselines:
        baselines = cls(decay)
        baselines._values = {str(key): float(value) for key, value in state.items()}
        return baselines


def compute_advantages(
    scored: list[Scored],
    *,
    current_version_index: int,
    baselines: RunningBaselines,
    config: GroupingConfig,
) -> tuple[list[Advantaged], dict[str, float]]:
    """Advantages for the samples that carry signal, in input order, plus metrics. Updates
    ``baselines`` in place with every non-stale reward (after using them)."""
    _check_rewards(scored)
    fresh = [s for s in scored if current_version_index - s.version_index <= config.max_staleness]
    kept, dropped = _advantages(fresh, baselines, config)
    if config.std_normalise:
        kept = _std_normalised(kept)
    for sample in fresh:
        baselines.update(sample.task_key, sample.reward)
    dropped["dropped_stale"] = len(scored) - len(fresh)
    return kept, _metrics(kept, fresh, dropped)


def _check_rewards(scored: list[Scored]) -> None:
    # One nan would poison a group mean and, through the baseline, every later batch.
    for sample in scored:
        if not math.isfinite(sample.reward):
            raise ValueError(f"reward of {sample.trajectory_id} is not finite: {sample.reward}")


def _advantages(
    fresh: list[Scored], baselines: RunningBaselines, config: GroupingConfig
) -> tuple[list[Advantaged], dict[str, int]]:
    """Kept samples in input order, and how many were dropped for each reason."""
    kept: dict[int, Advantaged] = {}
    dropped = {"dropped_flat": 0, "dropped_no_baseline": 0}
    for name, indices in _group(fresh).items():
        members = [fresh[i] for i in indices]
        if len(members) >= config.min_group_size:
            values, reason = _group_advantages(members)
        else:
            values, reason = _baseline_advantages(members, baselines)
        for i, value in zip(indices, values, strict=True):
            if value is None:
                dropped[reason] += 1
            else:
                kept[i] = Advantaged(fresh[i].trajectory_id, value, name)
    return [kept[i] for i in sorted(kept)], dropped


def _group(samples: list[Scored]) -> dict[str, list[int]]:
    """Group name -> positions of its members in ``samples``."""
    groups: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        if sample.group_id is not None:
            name = f"group:{sample.group_id}"
        else:
            name = f"task:{sample.task_key}"
        groups.setdefault(name, []).append(i)
    return groups


def _group_advantages(members: list[Scored]) -> tuple[list[float | None], str]:
    """reward - group mean; None for every member of a flat group."""
    rewards = [s.reward for s in members]
    if max(rewards) - min(rewards) <= FLAT_TOLERANCE:
        return [None] * len(members), "dropped_flat"
    mean = statistics.fmean(rewards)
    return [reward - mean for reward in rewards], "dropped_flat"


def _baseline_advantages(
    members: list[Scored], baselines: RunningBaselines
) -> tuple[list[float | None], str]:
    """reward - the task's running baseline. The members of one undersized group share a task
    key in practice; if not, each uses its own. A missing baseline drops the whole group, so a
    group is never half-trained; a zero advantage is dropped as flat."""
    base = [baselines.get(s.task_key) for s in members]
    if any(b is None for b in base):
        return [None] * len(members), "dropped_no_baseline"
    values = [s.reward - b for s, b in zip(members, base, strict=True) if b is not None]
    return [v if abs(v) > FLAT_TOLERANCE else None for v in values], "dropped_flat"


def _std_normalised(kept: list[Advantaged]) -> list[Advantaged]:
    std = statistics.pstdev(a.advantage for a in kept) if kept else 0.0
    # One sample, or all advantages equal: nothing to scale by, leave them as they are.
    if std <= FLAT_TOLERANCE:
        return kept
    return [Advantaged(a.trajectory_id, a.advantage / std, a.group) for a in kept]


def _metrics(
    kept: list[Advantaged], fresh: list[Scored], dropped: dict[str, int]
) -> dict[str, float]:
    return {
        "groups": float(len({a.group for a in kept})),
        "kept": float(len(kept)),
        "dropped_stale": float(dropped["dropped_stale"]),
        "dropped_flat": float(dropped["dropped_flat"]),
        "dropped_no_baseline": float(dropped["dropped_no_baseline"]),
        # Over every fresh reward, not just kept ones: the policy's performance, unbiased by
        # the flat-group filter.
        "mean_reward": statistics.fmean(s.reward for s in fresh) if fresh else 0.0,
        "mean_abs_advantage": statistics.fmean(abs(a.advantage) for a in kept) if kept else 0.0,
    }
