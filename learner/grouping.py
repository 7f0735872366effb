"""GRPO groups and advantages from graded trajectories (pure Python).

Invariant: every input sample is accounted for exactly once -- either it comes back with an
advantage or it is counted in one ``dropped_*`` metric -- and nothing that carries no learning
signal (stale, flat group, singleton without a baseline) comes back, so the trainer's global
token count only ever covers tokens that move the policy.

Rules, in order:
1. Samples produced more than ``max_staleness`` versions before the current one are dropped.
2. The rest are grouped by ``group_id`` (fan-out, rollout runner) or else by ``task_key``
   and the policy version that produced them: GRPO compares replies of one policy to one
   prompt. Live traffic repeats a prompt across versions; one group over all of them would
   credit the newer replies for the policy having improved, and would make a step bounded
   by max_batch_trajectories take old versions' members along with the new ones.
3. A group of at least ``min_group_size``: advantage = reward - group mean; if all its
   rewards are equal it carries no signal and is dropped whole.
4. A smaller group (a singleton by default): each sample's advantage = reward - the task's
   running baseline as it stood BEFORE this batch; a task without one (seen for the first
   time: most organic traffic is unique prompts) is compared with its interaction type's
   baseline instead (learner/type_baselines.py: by default the mean of the other rewards of
   that type and policy version, earlier batches' and this one's), counted in
   ``baseline_from_type``; neither -> the group is dropped (``dropped_no_baseline``; its
   rewards only seed the baselines); an advantage of exactly 0 is dropped as flat, like a
   flat group.
5. Optionally all kept advantages are divided by their batch standard deviation.
6. Every non-stale reward then updates its task's running baseline and its type's
   baselines, in input order.

``bound_batch`` picks a step's batch when more carry a signal than one step may train on
(max_batch_trajectories): the newest whole groups; the rest waits for a later step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

# RunningBaselines lives beside the type baselines, which keep one too (their ema)
from learner.type_baselines import Reward, RunningBaselines, TypeBaselines, TypeBaselinesState

# Rewards closer than this are "equal": subtracting a mean leaves only rounding noise.
FLAT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Scored:
    trajectory_id: str
    task_key: str
    reward: float
    version_index: int  # ordinal of the policy version that produced it (higher = newer)
    group_id: str | None = None  # explicit group (fan-out / rollout); else grouped by task_key
    interaction_type: str | None = None  # None: recorded without one (type "untyped")


def shuffle_rewards(scored: list[Scored]) -> list[Scored]:
    """The same trajectories with their rewards permuted among them (a control run). The
    permutation depends only on which trajectories there are, so the batch a learner reads
    again at its next poll is shuffled the same way."""
    ordered = sorted(scored, key=lambda s: s.trajectory_id)
    seed = hashlib.sha256("\n".join(s.trajectory_id for s in ordered).encode()).digest()
    rewards = [s.reward for s in ordered]
    random.Random(seed).shuffle(rewards)
    moved = {s.trajectory_id: r for s, r in zip(ordered, rewards, strict=True)}
    return [dataclasses.replace(s, reward=moved[s.trajectory_id]) for s in scored]


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
    # "group:<group_id>" or "task:<task_key>@v<version index>": the namespaces never collide
    group: str


class BaselineStates(TypedDict):
    """`Baselines` as JSON, each under its learner-state key (`Baselines.KEYS`)."""

    baselines: dict[str, float]  # by task
    type_baselines: TypeBaselinesState


@dataclass
class Baselines:
    """What the learner keeps between batches (and in learner_state, under these keys):
    the per-task running baselines and the per-type ones."""

    KEYS: ClassVar[tuple[str, str]] = ("baselines", "type_baselines")

    tasks: RunningBaselines
    types: TypeBaselines

    @classmethod
    def fresh(cls, type_mode: str = "version") -> Baselines:
        return cls(RunningBaselines(), TypeBaselines(type_mode))

    @classmethod
    def from_states(cls, states: Mapping[str, Any], type_mode: str = "version") -> Baselines:
        return cls(
            RunningBaselines.from_state(states.get("baselines") or {}),
            TypeBaselines.from_state(states.get("type_baselines") or {}, type_mode),
        )

    def states(self) -> BaselineStates:
        return {"baselines": self.tasks.state(), "type_baselines": self.types.state()}

    def copy(self) -> Baselines:
        return Baselines.from_states(self.states(), self.types.mode)


def compute_advantages(
    scored: list[Scored],
    *,
    current_version_index: int,
    baselines: RunningBaselines,
    config: GroupingConfig,
    type_baselines: TypeBaselines | None = None,
) -> tuple[list[Advantaged], dict[str, float]]:
    """Advantages for the samples that carry signal, in input order, plus metrics. Updates
    ``baselines`` and ``type_baselines`` (None: no type baselines) in place with every
    non-stale reward (after using them)."""
    _check_rewards(scored)
    oldest = current_version_index - config.max_staleness
    fresh = [s for s in scored if s.version_index >= oldest]
    rewards = [Reward(s.interaction_type, s.version_index, s.reward) for s in fresh]
    if type_baselines is None:
        by_type: list[float | None] = [None] * len(fresh)
    else:
        by_type = type_baselines.for_batch(rewards)
    kept, counts = _advantages(fresh, baselines, by_type, config)
    if config.std_normalise:
        kept = _std_normalised(kept)
    for sample in fresh:
        baselines.update(sample.task_key, sample.reward)
    if type_baselines is not None:
        type_baselines.update(rewards, oldest_version=oldest)
    counts["dropped_stale"] = len(scored) - len(fresh)
    return kept, _metrics(kept, fresh, counts)


def _check_rewards(scored: list[Scored]) -> None:
    # One nan would poison a group mean and, through the baseline, every later batch.
    for sample in scored:
        if not math.isfinite(sample.reward):
            raise ValueError(f"reward of {sample.trajectory_id} is not finite: {sample.reward}")


def _advantages(
    fresh: list[Scored],
    baselines: RunningBaselines,
    by_type: list[float | None],
    config: GroupingConfig,
) -> tuple[list[Advantaged], dict[str, int]]:
    """Kept samples in input order, and how many were dropped for each reason (plus how many
    kept ones were compared with their type's baseline)."""
    kept: dict[int, Advantaged] = {}
    counts = {"dropped_flat": 0, "dropped_no_baseline": 0, "baseline_from_type": 0}
    for name, indices in _group(fresh).items():
        members = [fresh[i] for i in indices]
        from_type = [False] * len(members)
        if len(members) >= config.min_group_size:
            values, reason = _group_advantages(members)
        else:
            base = [baselines.get(s.task_key) for s in members]
            from_type = [b is None for b in base]
            base = [by_type[i] if b is None else b for i, b in zip(indices, base, strict=True)]
            values, reason = _baseline_advantages(members, base)
        for i, value, typed in zip(indices, values, from_type, strict=True):
            if value is None:
                counts[reason] += 1
            else:
                kept[i] = Advantaged(fresh[i].trajectory_id, value, name)
                counts["baseline_from_type"] += typed
    return [kept[i] for i in sorted(kept)], counts


def group_name(sample: Scored) -> str:
    """The GRPO group a sample belongs to (``Advantaged.group``)."""
    if sample.group_id is not None:
        return f"group:{sample.group_id}"
    return f"task:{sample.task_key}@v{sample.version_index}"


def _group(samples: list[Scored]) -> dict[str, list[int]]:
    """Group name -> positions of its members in ``samples``."""
    groups: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(group_name(sample), []).append(i)
    return groups


def bound_batch(
    scored: list[Scored], advantaged: list[Advantaged], *, limit: int, oldest: int
) -> tuple[list[Scored], list[Scored]]:
    """(this step's batch, what waits for a later step), each in input order, so that the
    batch holds at most ``limit`` trajectories with a signal (``advantaged``, computed over
    all of ``scored``): the newest whole groups with a signal first (on-policy learns
    fastest; newest: the group's oldest policy version, then its last-graded member), a
    group never split, the first always taken whole even when larger than ``limit``. What
    carries no signal (flat groups, no baseline) and what is already stale (version below
    ``oldest``) always goes into the batch: it costs the trainer nothing, and the step
    records it as dropped. What waits stays untrained: a later step takes it, or, once
    more than max_staleness versions old, drops it as stale. ``limit`` <= 0: no bound."""
    signal: dict[str, int] = {}
    for a in advantaged:
        signal[a.group] = signal.get(a.group, 0) + 1
    if limit <= 0 or sum(signal.values()) <= limit:
        return list(scored), []
    newest: dict[str, tuple[int, int]] = {}  # group -> (oldest version, last position)
    for i, s in enumerate(scored):
        name = group_name(s)
        if name in signal and s.version_index >= oldest:
            version, _ = newest.get(name, (s.version_index, i))
            newest[name] = (min(version, s.version_index), i)
    taken: set[str] = set()
    room = limit
    for name in sorted(newest, key=lambda g: newest[g], reverse=True):
        if taken and signal[name] > room:
            break  # the next newest does not fit: it and everything older wait
        taken.add(name)
        room -= signal[name]
    batch: list[Scored] = []
    waiting: list[Scored] = []
    for s in scored:
        name = group_name(s)
        waits = name in signal and name not in taken and s.version_index >= oldest
        (waiting if waits else batch).append(s)
    return batch, waiting


def _group_advantages(members: list[Scored]) -> tuple[list[float | None], str]:
    """reward - group mean; None for every member of a flat group."""
    rewards = [s.reward for s in members]
    if max(rewards) - min(rewards) <= FLAT_TOLERANCE:
        return [None] * len(members), "dropped_flat"
    mean = statistics.fmean(rewards)
    return [reward - mean for reward in rewards], "dropped_flat"


def _baseline_advantages(
    members: list[Scored], base: list[float | None]
) -> tuple[list[float | None], str]:
    """reward - each member's baseline (its task's, else its type's). The members of one
    undersized group share a task key in practice; if not, each uses its own. A missing
    baseline drops the whole group, so a group is never half-trained; a zero advantage is
    dropped as flat."""
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
    kept: list[Advantaged], fresh: list[Scored], counts: dict[str, int]
) -> dict[str, float]:
    return {
        "groups": float(len({a.group for a in kept})),
        "kept": float(len(kept)),
        "dropped_stale": float(counts["dropped_stale"]),
        "dropped_flat": float(counts["dropped_flat"]),
        "dropped_no_baseline": float(counts["dropped_no_baseline"]),
        # kept samples whose task had no baseline, compared with their interaction type's
        "baseline_from_type": float(counts["baseline_from_type"]),
        # Over every fresh reward, not just kept ones: the policy's performance, unbiased by
        # the flat-group filter.
        "mean_reward": statistics.fmean(s.reward for s in fresh) if fresh else 0.0,
        "mean_abs_advantage": statistics.fmean(abs(a.advantage) for a in kept) if kept else 0.0,
    }
