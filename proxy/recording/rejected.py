"""Rows the database refused, kept in `<spool>.rejected`, and how they are retried.

The writer appends `{"error", "rows"}` lines (one refused row each) and never retries them
itself: a refused row is about its data or the schema, so it waits for a person to fix the
cause. `replay` (`onthejob spool replay`) then writes each again; what the database takes
leaves the file, what it still refuses goes back with the new reason.

Invariant: a running proxy may append to the file meanwhile; the replay works on a renamed
copy, so no line is lost to the race, and a replay that dies is resumed by the next one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from proxy.recording.rows import empty_rows
from proxy.recording.spool import RejectedBatch, Spool
from proxy.recording.writer import Unreachable, short_reason
from store import recording
from store.errors import is_unreachable

log = logging.getLogger("onthejob.rejected")


@dataclass
class Replayed:
    written: int = 0  # rows the database took
    refused: int = 0  # rows it still refuses (back in the file)
    first_reason: str | None = None


def replay(engine: Engine, path: Path) -> Replayed:
    """Write the rejected rows again. Raises Unreachable (what is left stays for next time)."""
    result = Replayed()
    working = path.with_name(path.name + ".replaying")
    if working.exists():  # a replay that died: finish it first
        _replay_file(engine, working, path, result)
    if path.exists():
        os.rename(path, working)  # the proxy's next refusal starts a new file
        _replay_file(engine, working, path, result)
    return result


def _replay_file(engine: Engine, working: Path, path: Path, result: Replayed) -> None:
    still: list[RejectedBatch] = []
    for entry in Spool(working).batches():
        rows = {**empty_rows(), **entry.get("rows", {})}
        try:
            with engine.begin() as conn:
                recording.write_batch(conn, **rows)  # idempotent: a row in already changes nothing
        except Exception as exc:
            if is_unreachable(exc):
                raise Unreachable(short_reason(exc)) from exc
            still.append({"error": short_reason(exc), "rows": rows})
            continue
        result.written += 1
    kept = Spool(path)
    for entry in still:  # written before the working copy goes: a crash only duplicates
        kept.append(entry)
    working.unlink()
    result.refused += len(still)
    if still and result.first_reason is None:
        result.first_reason = still[0]["error"]
