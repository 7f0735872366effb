"""Stopping the learner without leaving a swap half done.

A learner stopped between its gates closing and reopening leaves every replica fenced off:
the proxies hold the replicas' traffic and then refuse it, until a learner restores what
serves. So a stop (SIGTERM, Ctrl-C) that arrives during a swap waits for the swap to end,
verified or restored, and the learner stops right after it; anywhere else it stops at once,
which loses nothing (an unrecorded step is trained again after a restart). A second signal
stops at once, also mid-swap: the next learner restores what serves.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger("onthejob.learner")


class GracefulStop:
    def __init__(self) -> None:
        self._requested = threading.Event()
        self._swaps = 0

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def request(self) -> bool:
        """Ask the learner to stop; True when it may stop now (no swap is under way)."""
        again = self._requested.is_set()
        self._requested.set()
        return again or self._swaps == 0

    def wait(self, seconds: float) -> None:
        """Sleep `seconds`, or less once a stop is requested."""
        self._requested.wait(seconds)

    @contextlib.contextmanager
    def swap(self) -> Iterator[None]:
        """A swap: a stop requested during it takes effect when it ends (KeyboardInterrupt)."""
        self._swaps += 1
        try:
            yield
        finally:
            self._swaps -= 1
        if self._swaps == 0 and self._requested.is_set():
            log.info("the swap is done: stopping as asked")
            raise KeyboardInterrupt

    def install(self) -> None:
        """SIGTERM and SIGINT go through `request` (call from the main thread)."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self.request():
                raise KeyboardInterrupt
            log.warning(
                "%s: stopping once the swap under way is verified or restored "
                "(again to stop now, leaving the replicas for the next learner to restore)",
                signal.Signals(signum).name,
            )

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
