"""Append-only spool file: where records wait while the database is unreachable.

One JSON line per row batch, fsynced before `append` returns, so a crash loses nothing
that was spooled. Replaying is idempotent (rows are inserted with ON CONFLICT DO NOTHING),
so the file is only truncated after every batch in it has been written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("onthejob.spool")


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, batch: dict[str, Any]) -> None:
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

    def batches(self) -> list[dict[str, Any]]:
        """Every complete batch in the file; a torn last line (crash mid-write) is skipped."""
        if not self.size():
            return []
        out = []
        with open(self.path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                try:
                    out.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    log.warning("spool %s line %d is torn; skipped", self.path, number)
        return out

    def clear(self) -> None:
        with open(self.path, "r+b") as handle:
            handle.truncate(0)
            os.fsync(handle.fileno())
