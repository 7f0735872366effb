"""Where a step's time went, from the last step's end to this one's swap (pure Python).

Under continuous traffic a step's wall time is not its training alone: the learner gathers
a batch (trajectories finish, the proxy closes them after its idle timeout, the grader
scores them), may wait for the serving version's own samples (--fresh-wait) or for idle
replicas (--yield-to-traffic), trains, saves and swaps. Where vLLM-CPU serves on the same
cores, training itself is slowed by contention: the trainer's threads get only a share of
the cores' time. `StepTime` holds each part and says it in one clause of the step line, so
an operator sees which part to shorten (issue 42: a step of 20 replies took 92 s to train
beside a busy vLLM, against about 10 s unloaded).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class StepTime:
    gathering: float  # seconds from the last step's end until a batch was ready
    fresh_wait: float  # --fresh-wait
    yield_wait: float  # --yield-to-traffic
    training: float  # wall seconds of the optimizer step
    training_cpu: float  # CPU seconds the learner's process used meanwhile
    threads: int  # torch's threads while training
    saving: float
    swap: float
    grading_lag: float | None  # median seconds from a trained trajectory's last call to its grade
    sample_age: float | None  # median seconds from a trained trajectory's first call to the step
    paused: int = 0  # replicas on this host paused while the trainer computed (--time-slice)

    @property
    def total(self) -> float:
        return (
            self.gathering + self.fresh_wait + self.yield_wait + self.training + self.saving
            + self.swap
        )  # fmt: skip

    @property
    def cpu_share(self) -> float | None:
        return cpu_share(self.training, self.training_cpu, self.threads)

    def metrics(self) -> dict[str, float]:
        """For the trackers: the cycle, and each part known once the step has swapped."""
        out = {
            "cycle_seconds": round(self.total, 2),
            "gathering_seconds": round(self.gathering, 2),
            **training_metrics(self.training, self.training_cpu, self.threads),
        }
        if self.grading_lag is not None:
            out["grading_lag_seconds"] = round(self.grading_lag, 2)
        if self.sample_age is not None:
            out["sample_age_seconds"] = round(self.sample_age, 2)
        return out

    def summary(self) -> str:
        """E.g. "time 131.2s since the last step: 30.1s gathering the batch (grading lag 2.1s,
        samples 25.3s old), 0.0s waiting for fresh samples, 0.0s for idle replicas, 92.3s
        training (1 thread computed 48% of the time: the rest went to other processes on its
        cores), 2.5s saving, 0.45s swap"."""
        gathered = f"{self.gathering:.1f}s gathering the batch"
        lags = []
        if self.grading_lag is not None:
            lags.append(f"grading lag {self.grading_lag:.1f}s")
        if self.sample_age is not None:
            lags.append(f"samples {self.sample_age:.1f}s old")
        if lags:
            gathered += f" ({', '.join(lags)})"
        training = f"{self.training:.1f}s training"
        share = self.cpu_share
        if share is not None:
            training += (
                f" ({self.threads} thread{'s' if self.threads != 1 else ''} computed "
                f"{100 * share:.0f}% of the time"
            )
            training += ": the rest went to other processes on its cores" if share < 0.8 else ""
            training += f", {self.paused} replica(s) on this host paused)" if self.paused else ")"
        return (
            f"time {self.total:.1f}s since the last step: {gathered}, "
            f"{self.fresh_wait:.1f}s waiting for fresh samples, {self.yield_wait:.1f}s for "
            f"idle replicas, {training}, {self.saving:.1f}s saving, {self.swap:.2f}s swap"
        )


def cpu_share(training: float, training_cpu: float, threads: int) -> float | None:
    """The share of its threads' time the trainer computed over `training` wall seconds: 1.0
    alone on free cores, less where other processes (vLLM on the same cores) took the rest."""
    if training <= 0 or threads <= 0:
        return None
    return min(1.0, training_cpu / (training * threads))


def training_metrics(training: float, training_cpu: float, threads: int) -> dict[str, float]:
    """What training's contention is, for the step's record (known before it is saved)."""
    out = {"training_cpu_seconds": round(training_cpu, 2), "trainer_threads": float(threads)}
    share = cpu_share(training, training_cpu, threads)
    if share is not None:
        out["trainer_cpu_share"] = round(share, 3)
    return out


def median_seconds(
    pairs: Sequence[tuple[datetime | None, datetime | None]],
) -> float | None:
    """The median of (later - earlier) in seconds over the pairs where both are known."""
    spans = [
        (later - earlier).total_seconds()
        for earlier, later in pairs
        if earlier is not None and later is not None
    ]
    return statistics.median(spans) if spans else None
