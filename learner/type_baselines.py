"""Baselines per interaction type, for samples whose task has no baseline of its own.

Live traffic is mostly unique prompts: a task seen once has no group and no running
baseline, so without these it would teach nothing. The type (the `X-Onthejob-Type` header,
else a fingerprint of harness, system prompt and tools) groups trajectories of one kind of
interaction, whose rewards under one policy version are comparable. A trajectory recorded
without a type counts as the type ``UNTYPED``.

Every fresh reward is folded in after the batch (like the per-task baselines): an
exponential moving average per type across versions, and a count and sum per type and
version for the versions not yet stale. What a sample is compared with is the ``mode``:

- ``version`` (default): the mean of every OTHER reward of its type and policy version, from
  earlier batches and this one (leave-one-out, so a sample is never its own baseline); none
  yet: the type's moving average across versions; none either: no baseline.
- ``batch``: the leave-one-out mean of its type and version within this batch only.
- ``ema``: the type's moving average as it stood before this batch; a type never seen: the
  leave-one-out mean of its type within this batch (else nothing would ever seed it: a
  batch without signal is never trained, so never folded in).
- ``off``: none (a task seen once is dropped, as before there were types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

MODES = ("version", "batch", "ema", "off")
UNTYPED = "untyped"  # the type of trajectories recorded without one


class Reward(NamedTuple):
    interaction_type: str | None
    version_index: int
    reward: float


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


class TypeBaselinesState(TypedDict):
    """`TypeBaselines` as JSON (the learner state's ``type_baselines``)."""

    ema: dict[str, float]  # by interaction type
    versions: dict[str, dict[str, list[float]]]  # type -> "<version>" -> [count, sum]


class TypeBaselines:
    def __init__(self, mode: str = "version", decay: float = 0.9) -> None:
        if mode not in MODES:
            raise ValueError(f"type baseline mode must be one of {', '.join(MODES)}: {mode!r}")
        self.mode = mode
        self._ema = RunningBaselines(decay)  # by type name (it checks decay)
        # type -> version index -> (count, sum) of the rewards folded in
        self._versions: dict[str, dict[int, tuple[int, float]]] = {}

    def for_batch(self, batch: Sequence[Reward]) -> list[float | None]:
        """The baseline of each reward of ``batch`` (None: none), from the state before it."""
        if self.mode == "off":
            return [None] * len(batch)
        in_batch: dict[tuple[str, int | None], tuple[int, float]] = {}
        for kind, version, reward in batch:
            # by type and version, and (for ema's seed) by type alone under version None
            for key in ((_name(kind), version), (_name(kind), None)):
                count, total = in_batch.get(key, (0, 0.0))
                in_batch[key] = (count + 1, total + reward)
        return [self._baseline(r, in_batch) for r in batch]

    def _baseline(
        self, sample: Reward, in_batch: Mapping[tuple[str, int | None], tuple[int, float]]
    ) -> float | None:
        kind = _name(sample.interaction_type)
        if self.mode == "ema":
            ema = self._ema.get(kind)
            if ema is not None:
                return ema
            return _leave_one_out(in_batch[kind, None], sample.reward)
        count, total = in_batch[kind, sample.version_index]
        if self.mode == "version":
            seen, seen_total = self._versions.get(kind, {}).get(sample.version_index, (0, 0.0))
            count, total = count + seen, total + seen_total
        mean = _leave_one_out((count, total), sample.reward)
        if mean is None and self.mode == "version":
            return self._ema.get(kind)
        return mean

    def update(self, batch: Sequence[Reward], *, oldest_version: int) -> None:
        """Fold ``batch`` in, in order; forget versions before ``oldest_version`` (stale: no
        sample of theirs is trained any more)."""
        for kind, version, reward in batch:
            name = _name(kind)
            self._ema.update(name, reward)
            versions = self._versions.setdefault(name, {})
            count, total = versions.get(version, (0, 0.0))
            versions[version] = (count + 1, total + reward)
        for versions in self._versions.values():
            for version in [v for v in versions if v < oldest_version]:
                del versions[version]

    def ema(self, interaction_type: str | None) -> float | None:
        return self._ema.get(_name(interaction_type))

    def version_mean(self, interaction_type: str | None, version_index: int) -> float | None:
        count, total = self._versions.get(_name(interaction_type), {}).get(version_index, (0, 0))
        return total / count if count else None

    def state(self) -> TypeBaselinesState:
        """JSON: {"ema": {type: value}, "versions": {type: {"<version>": [count, sum]}}}."""
        return {
            "ema": self._ema.state(),
            "versions": {
                kind: {str(v): [c, t] for v, (c, t) in versions.items()}
                for kind, versions in self._versions.items()
            },
        }

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], mode: str = "version", decay: float = 0.9
    ) -> TypeBaselines:
        baselines = cls(mode, decay)
        baselines._ema = RunningBaselines.from_state(state.get("ema", {}), decay)
        baselines._versions = {
            str(kind): {int(v): (int(c), float(t)) for v, (c, t) in versions.items()}
            for kind, versions in state.get("versions", {}).items()
        }
        return baselines


def _name(interaction_type: str | None) -> str:
    return UNTYPED if interaction_type is None else interaction_type


def _leave_one_out(count_total: tuple[int, float], reward: float) -> float | None:
    count, total = count_total
    return (total - reward) / (count - 1) if count > 1 else None
