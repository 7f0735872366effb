"""Waiting for on-policy samples: a ready step gives the serving version time to answer.

Under continuous traffic, with vLLM and the trainer on the same machine, the calls answered
while a step trains come from the version before it: a step that starts right after its
swap trains on samples one version old, or older, with their importance weights cut where
the policy moved. Measured on SmolLM2 (bench/learning_per_step.py, docs/measurements/
real-models.md), that made the live loop gain under half of what a bare on-policy loop gains
in as many steps. With ``--fresh-wait S`` a step that is ready waits, for up to S seconds,
until ``--batch-trajectories`` trajectories with a signal come from the serving version
itself (grading goes on meanwhile); then it trains, the newest groups first. Traffic that
is slow or gone delays a step by at most S, never starves it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from learner.step_wait import ReadySince


@dataclass
class FreshWait(ReadySince):
    """Whether a ready step should wait for the serving version's own samples."""

    limit_seconds: float
    ready_since: float | None = field(default=None, init=False)

    def should_wait(self, enough_fresh: bool, now: float | None = None) -> bool:
        """True while the serving version has produced too few trajectories with a signal
        (`enough_fresh` False) and the step has waited less than limit_seconds; call it at
        each look while a step is ready, and `took` once it starts."""
        if self.limit_seconds <= 0 or enough_fresh:
            return False
        now = time.monotonic() if now is None else now
        if self.ready_since is None:
            self.ready_since = now
        return now - self.ready_since < self.limit_seconds
