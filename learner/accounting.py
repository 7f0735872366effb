"""What a step looked at, what it trained on, and what it dropped, by reason (pure Python).

A step considers trajectories; some never reach the trainer (stale, served by no verified
version, a flat group, no baseline); those that do are built into samples from their calls,
of which some cannot be used (failed, sampling unknown, ...); of the samples, some are not
trained on (truncated at max_tokens and masked, nothing to train, a sequence mismatch).
Each drop is counted once, in the unit it happens in -- trajectories, calls or samples, never
mixed -- with the setting that changes it, so a step that trains on almost nothing says so,
and why (issue 23: 7,799 of 7,840 calls cut at max_tokens left steps of 1-6 samples while
their line said "kept 256").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from store.json_types import JsonValue

# a step that trains on less than this share of the trajectories it considered is warned of
LOW_SHARE = 0.25

TRAJECTORIES, CALLS, SAMPLES = "trajectories", "calls", "samples"


class Dropped(TypedDict):
    """One reason a step left something out, with its count (`StepAccount.dropped`)."""

    reason: str  # the key of REASONS (or a call's skip reason)
    label: str
    unit: str
    count: int
    setting: str


class AccountMetrics(TypedDict):
    """What a step's account adds to its metrics (`StepAccount.metrics`)."""

    considered_trajectories: int
    signal_trajectories: int
    waiting_trajectories: int
    trained_trajectories: int
    samples_built: int
    trained_samples: int
    trained_share: float
    dropped: list[Dropped]


class LastBatch(AccountMetrics):
    """The last batch a step took, as the heartbeat shows it."""

    step: int
    trained: bool


@dataclass(frozen=True)
class Reason:
    label: str  # as the step line prints it
    unit: str  # TRAJECTORIES, CALLS or SAMPLES
    setting: str  # what changes it ("no setting: ..." where nothing does)


REASONS: dict[str, Reason] = {
    # trajectories, before any of their tokens are read
    "stale": Reason("stale", TRAJECTORIES, "--max-staleness"),
    # its first call was served by no version the learner verified
    "unknown_version": Reason("unknown version", TRAJECTORIES, "no setting: no verified version"),
    # every reward of its group equal (or a singleton's equal to its baseline): no advantage
    "flat_group": Reason(
        "flat group", TRAJECTORIES, "group size: --fanout, --group-size; or task difficulty"
    ),
    # seen once, and neither its task nor its interaction type has a baseline
    "no_baseline": Reason("no baseline", TRAJECTORIES, "--type-baseline, or groups: --fanout"),
    # samples, built from the trajectories with a signal
    "truncated": Reason(
        "truncated",
        SAMPLES,
        "--truncated train, or a larger max_tokens in the harness",
    ),
    "no_tokens": Reason("no tokens", SAMPLES, "no setting: nothing sampled"),
    # per-turn credit: no reply of the sample was judged by a next-turn signal (the rules
    # were silent on all of them); a judge covers those, trajectory credit trains them all
    "not_credited": Reason(
        "no judged turn", SAMPLES, "a judge for the rest: --grader next_turn:judge"
    ),
    # recorded and recomputed logprobs disagree: not the weights we think sampled them
    "mismatch": Reason("sequence mismatch", SAMPLES, "max_sequence_mismatch"),
}

# calls store/samples.py could not build into a sample, by its reason
CALL_SETTINGS: dict[str, str] = {
    # the proxy did not know the replica's sampling defaults (docs/learner/run.md)
    "sampling unknown": "vLLM --enable-scale-out",
    "failed": "no setting: the call failed",
    "incomplete capture": "no setting: tokens not captured",
    "no completion": "no setting: nothing sampled",
    # another model answered (serve --teacher-url): learn --supervised-from teacher uses it
    "teacher answered": "no setting: not the student's tokens",
}
# any other reason names logits processing the client asked for (logit_bias, response_format...)
CONSTRAINT_SETTING = "the client's request: not reproducible"

# grouping's metric -> reason (learner/grouping.py counts these)
GROUPING_DROPS = {
    "dropped_stale": "stale",
    "stale_not_graded": "stale",  # too stale to grade (learner/loop/grading.py)
    "dropped_unknown_version": "unknown_version",
    "dropped_flat": "flat_group",
    "dropped_no_baseline": "no_baseline",
}


def reason_of(key: str, unit: str) -> Reason:
    if unit == CALLS:
        return Reason(key, CALLS, CALL_SETTINGS.get(key, CONSTRAINT_SETTING))
    return REASONS[key]


@dataclass
class StepAccount:
    """One step's accounting. Invariants: `considered` = the trajectories dropped + those
    with a signal; `samples_built` = the samples dropped + `trained_samples`."""

    considered: int = 0  # trajectories the step consumes (marked with its step)
    with_signal: int = 0  # of them, those with an advantage (grouping's "kept")
    # trajectories with a signal left for a later step (max_batch_trajectories): not
    # considered, not dropped, not marked
    waiting: int = 0
    trajectories: Counter[str] = field(default_factory=Counter)  # dropped, by reason
    calls: Counter[str] = field(default_factory=Counter)  # not built into samples, by reason
    samples_built: int = 0
    samples: Counter[str] = field(default_factory=Counter)  # dropped, by reason
    trained_trajectories: int = 0  # with at least one sample given to the trainer
    trained_samples: int = 0

    @classmethod
    def of_grouping(
        cls, group_metrics: Mapping[str, float], *, considered: int, waiting: int = 0
    ) -> StepAccount:
        """From compute_advantages' metrics (plus the learner's `stale_not_graded` and
        `dropped_unknown_version`): what was dropped before any token was read."""
        dropped: Counter[str] = Counter()
        for key, reason in GROUPING_DROPS.items():
            n = int(group_metrics.get(key, 0))
            if n:
                dropped[reason] += n
        return cls(
            considered=considered,
            with_signal=int(group_metrics.get("kept", 0)),
            waiting=waiting,
            trajectories=dropped,
        )

    def built(
        self,
        *,
        calls_skipped: Mapping[str, int],
        samples: int,
        dropped: Mapping[str, int],
        trajectories: int,
    ) -> None:
        """The samples built from the trajectories with a signal: `calls_skipped` by reason,
        `samples` built, `dropped` of them by reason before the trainer saw them, and how
        many `trajectories` the trainer got a sample of."""
        self.calls.update({k: v for k, v in calls_skipped.items() if v})
        self.samples_built = samples
        self.samples.update({k: v for k, v in dropped.items() if v})
        self.trained_trajectories = trajectories
        self.trained_samples = samples - sum(self.samples.values())

    def trained(self, step_metrics: Mapping[str, JsonValue]) -> None:
        """What the trainer's step said: sequences it dropped for their mismatch, or that
        nothing had a token to train on."""
        mismatch = int(step_metrics.get("dropped_mismatch", 0) or 0)
        if step_metrics.get("skipped") == "no trainable tokens" and self.trained_samples:
            self.samples["no_tokens"] += self.trained_samples
        elif mismatch:
            self.samples["mismatch"] += mismatch
        self.trained_samples = self.samples_built - sum(self.samples.values())
        if not self.trained_samples:
            self.trained_trajectories = 0

    # -- reading it -------------------------------------------------------------------
    def dropped(self) -> list[Dropped]:
        """Every reason with a count, biggest first: reason, label, unit, count, setting."""
        entries = []
        for unit, counts in ((TRAJECTORIES, self.trajectories), (CALLS, self.calls)):
            entries += [_entry(key, unit, n) for key, n in counts.items() if n]
        entries += [_entry(key, SAMPLES, n) for key, n in self.samples.items() if n]
        return sorted(entries, key=lambda e: -e["count"])

    @property
    def share(self) -> float:
        """The share of the trajectories considered that the trainer got a sample of."""
        return self.trained_trajectories / self.considered if self.considered else 0.0

    @property
    def low(self) -> bool:
        return self.considered > 0 and self.share < LOW_SHARE

    def metrics(self) -> AccountMetrics:
        """For TrainingStep.metrics (and the version's): the dashboard and export read it."""
        return {
            "considered_trajectories": self.considered,
            "signal_trajectories": self.with_signal,
            "waiting_trajectories": self.waiting,
            "trained_trajectories": self.trained_trajectories,
            "samples_built": self.samples_built,
            "trained_samples": self.trained_samples,
            "trained_share": self.share,
            "dropped": self.dropped(),
        }

    def summary(self) -> str:
        """E.g. "6 samples trained, from 4 of 268 trajectories considered; dropped: truncated
        241 samples (--truncated train, ...), flat group 9 trajectories (...)"."""
        text = (
            f"{_count(self.trained_samples, SAMPLES)} trained, from "
            f"{self.trained_trajectories} of {_count(self.considered, TRAJECTORIES)} considered"
        )
        text += "; dropped: " + (self.reasons() or "nothing")
        if self.waiting:
            text += (
                f"; {_count(self.waiting, TRAJECTORIES)} with a signal wait for a later step "
                "(--max-batch-trajectories)"
            )
        return text

    def reasons(self, limit: int | None = None) -> str:
        """The reasons, biggest first, each with its count, unit and setting."""
        entries = self.dropped()[:limit]
        return ", ".join(
            f"{e['label']} {_count(e['count'], e['unit'])} ({e['setting']})" for e in entries
        )

    def warning(self) -> str:
        """Why a step trained on so little (for a loud log line)."""
        return (
            f"trained on {self.trained_trajectories} of the {self.considered} trajectories "
            f"it considered ({100 * self.share:.0f}%), mostly dropped as "
            f"{self.reasons(limit=2) or 'nothing'}"
        )


def _entry(key: str, unit: str, count: int) -> Dropped:
    reason = reason_of(key, unit)
    return {
        "reason": key,
        "label": reason.label,
        "unit": unit,
        "count": int(count),
        "setting": reason.setting,
    }


SINGULAR = {TRAJECTORIES: "trajectory", CALLS: "call", SAMPLES: "sample"}


def _count(n: int, unit: str) -> str:
    return f"{n} {SINGULAR[unit] if n == 1 else unit}"
