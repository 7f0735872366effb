"""How long a ready step has waited: what the learner's waits before a step share
(`FreshWait` for the serving version's samples, `TrafficYield` for idle replicas)."""

from __future__ import annotations

import time


class ReadySince:
    """A wait that starts when a step first is ready (`ready_since`, monotonic seconds, set
    by the subclass's should_wait) and ends when it starts (`took`) or is no longer ready
    (`reset`)."""

    ready_since: float | None

    def waited(self, now: float | None = None) -> float:
        """Seconds the ready step has waited so far (0 if it never did)."""
        if self.ready_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.ready_since

    def took(self, now: float | None = None) -> float:
        """The step starts: how long it waited; the next one waits anew."""
        waited = self.waited(now)
        self.reset()
        return waited

    def reset(self) -> None:
        """No step is ready (any more): the next one that is waits from then."""
        self.ready_since = None
