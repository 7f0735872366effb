"""State the proxy holds in memory and follows from the store: read at start, then every
`poll_interval` seconds (changes made through another proxy), and changed at once by this
process's own admin API. A poll read that was in flight while this process changed the
state is read again, so it never puts back what the change replaced. While the store is
away the last state read stays in force.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger("onthejob.proxy")

T = TypeVar("T")


class Followed(Generic[T]):
    """Subclasses say how to read the state (`_read`, in a thread) and install it."""

    what = "state"  # for the log

    def __init__(self, engine: Engine, *, poll_interval: float) -> None:
        self.engine = engine
        self.poll_interval = poll_interval
        self.loaded = False
        self._lock = threading.Lock()
        self._changes = 0

    def _read(self) -> T:
        raise NotImplementedError

    def _install(self, value: T) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """One read before the first request; a store that is away does not stop start-up."""
        try:
            await self.refresh()
        except SQLAlchemyError as exc:
            log.warning("%s unreadable at start (%s); read once the store answers", self.what, exc)

    async def run(self) -> None:
        """Forever: read it every poll interval (keep what we have meanwhile)."""
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
            except SQLAlchemyError:
                log.debug("%s not re-read", self.what, exc_info=True)

    async def refresh(self) -> None:
        while True:
            seen = self._changes
            value = await asyncio.to_thread(self._read)
            with self._lock:
                if seen == self._changes:
                    self._install(value)
                    self.loaded = True
                    return

    def changed_here(self, change: Callable[[], None]) -> None:
        """Apply a change this process's admin API made: effective at once, and winning over
        a poll read in flight."""
        with self._lock:
            self._changes += 1
            change()
