"""Append-only spool file of row batches: `<spool>.rejected` (rows the database refused,
proxy/recording/rejected.py) and the spool older proxies kept while the database was away.

One JSON line per row batch, fsynced before `append` returns, so a crash loses nothing
that was spooled. An append writes one line and reads back one byte; the file is read only
to replay it, once, line by line. Replaying is idempotent (rows are inserted with ON
CONFLICT DO NOTHING), so the file is only truncated after every batch in it has been
written. (Calls wait for the database in the call log, proxy/recording/calllog.py, which the writer
reads from where it stopped; nothing re-reads a file per flush.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import orjson

from store.json_types import JsonObject

if TYPE_CHECKING:
    from proxy.recording.rows import Rows

log = logging.getLogger("onthejob.spool")


class RejectedBatch(TypedDict):
    """A batch the database refused, as `<spool>.rejected` keeps it."""

    error: str  # why, in short
    rows: Rows


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, batch: RejectedBatch) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = orjson.dumps(batch) + b"\n"
        with open(self.path, "a+b") as handle:
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    line = b"\n" + line  # close a torn line left by a crash
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def batches(self) -> Iterator[JsonObject]:
        """Every complete batch in the file, read as it is consumed (memory: one batch); a
        torn last line (crash mid-write) is skipped."""
        if not self.size():
            return
        with open(self.path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning("spool %s line %d is torn; skipped", self.path, number)

    def clear(self) -> None:
        with open(self.path, "r+b") as handle:
            handle.truncate(0)
            os.fsync(handle.fileno())
