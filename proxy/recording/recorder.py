"""Recording: a call's record goes to the call log before its answer ends.

`Recorder.record` runs on the event loop: it turns the record into one JSON line and appends
it to the call log (proxy/recording/calllog.py), a write() of a few microseconds that leaves the
record with the operating system, so a kill -9 of the proxy loses nothing. The writer thread
(proxy/recording/writer.py) moves the log into the database in batches; what the database has not
taken yet waits in the log, on disk, so memory stays bounded whatever the backlog.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TypedDict

import orjson
from sqlalchemy import Engine

from proxy.base.record import CallEntry, CallRecord
from proxy.recording.calllog import CallLog
from proxy.recording.rows import entry_of
from proxy.recording.spool import Spool
from proxy.recording.stitching import TrajectoryTracker
from proxy.recording.writer import Writer

log = logging.getLogger("onthejob.recording")


class Recorder:
    def __init__(
        self,
        engine: Engine,
        spool_path: Path,
        *,
        idle_timeout: float,
        flush_interval: float,
        answered_idle_timeout: float | None = None,
        batch_calls: int = 500,
        batch_bytes: int = 8 << 20,
        fsync_interval: float = 0.1,
        segment_bytes: int = 64 << 20,
        max_open: int = 100_000,
        check_schema: bool = False,
    ) -> None:
        self.engine = engine
        self.spool_path = spool_path
        self.log = CallLog(
            log_directory(spool_path), fsync_interval=fsync_interval, segment_bytes=segment_bytes
        )
        self.rejected_path = rejected_path(spool_path)
        self.tracker = TrajectoryTracker(
            idle_timeout, max_open=max_open, answered_timeout=answered_idle_timeout
        )
        self.idle_timeout = idle_timeout
        self.flush_interval = flush_interval
        self.batch_calls = batch_calls
        self.batch_bytes = batch_bytes
        self._check_schema = check_schema
        self.writer: Writer | None = None
        self.logged = 0  # lines appended by this process (event loop only)
        self.backlog_at_start = 0  # lines earlier runs left in the log

    # -- request path --------------------------------------------------------------------
    def record(self, call: CallRecord) -> None:
        """Put the record in the call log; never blocks on the database, never raises."""
        try:
            entry = entry_of(call)
            line = _line(entry)
        except Exception:
            log.exception("record %s could not be serialised; kept without its bodies", call.id)
            entry = _bare_entry(call)
            line = _line(entry)
        if self.log.append(line):
            self.logged += 1
        elif self.writer is not None:
            self.writer.unlogged.append(entry)  # the disk refused it: memory is all it has

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._open)
        assert self.writer is not None
        self.writer.start()

    def _open(self) -> None:
        self.log.open()
        self.writer = Writer(
            self.engine,
            self.log,
            tracker=self.tracker,
            rejected=Spool(self.rejected_path),
            legacy_spool=Spool(self.spool_path),
            flush_interval=self.flush_interval,
            batch_calls=self.batch_calls,
            batch_bytes=self.batch_bytes,
            check_schema=self._check_schema,
        )
        self.backlog_at_start = self.log.lines_between(self.log.committed, self.log.end)
        if self.backlog_at_start:
            log.info("%d calls in the call log from an earlier run", self.backlog_at_start)

    async def close(self) -> None:
        """Write what the log holds while the database answers (bounded), then fsync."""
        if self.writer is not None:
            await asyncio.to_thread(self.writer.stop)
        await asyncio.to_thread(self.log.close)

    # -- figures (any thread) ------------------------------------------------------------
    def status(self) -> RecorderStatus:
        writer = self.writer
        processed = writer.processed if writer else 0
        backlog_bytes = self.log.bytes_between(writer.cursor, self.log.end) if writer else 0
        return {
            # the batch being written: all the proxy holds in memory, within a batch's bounds
            "queue_depth": writer.in_memory_calls if writer else 0,
            "queue_bytes": writer.in_memory_bytes if writer else 0,
            "queue_limit_calls": self.batch_calls,
            "queue_limit_bytes": self.batch_bytes,
            "backlog_calls": self.backlog_at_start
            + self.logged
            - processed
            + (len(writer.unlogged) if writer else 0),
            "backlog_bytes": backlog_bytes,
            "log_bytes": self.log.disk_bytes(),
            "log_fsync_interval_s": self.log.fsync_interval,
            "log_write_errors": self.log.write_errors,
            "written": writer.written if writer else 0,
            "rejected": writer.rejected if writer else 0,
            "database": "unreachable" if writer and writer.unreachable else "ok",
        }


class RecorderStatus(TypedDict):
    """The recorder's figures (the admin API's stats, /metrics)."""

    queue_depth: int
    queue_bytes: int
    queue_limit_calls: int
    queue_limit_bytes: int
    backlog_calls: int
    backlog_bytes: int
    log_bytes: int
    log_fsync_interval_s: float
    log_write_errors: int
    written: int
    rejected: int
    database: str  # ok | unreachable


def log_directory(spool_path: Path) -> Path:
    """The call log lives beside the spool path: `<spool>.d/`."""
    return spool_path.with_name(spool_path.name + ".d")


def rejected_path(spool_path: Path) -> Path:
    return spool_path.with_name(spool_path.name + ".rejected")


def _line(entry: CallEntry) -> bytes:
    return orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)


def _bare_entry(call: CallRecord) -> CallEntry:
    """What is left of a record that cannot be serialised: the call, without its bodies."""
    bare = CallRecord(
        id=call.id, api=call.api, session_key=call.session_key, started_at=call.started_at
    )
    bare.status, bare.http_status = "error", call.http_status
    bare.error, bare.latency_ms = "record could not be serialised", call.latency_ms
    return entry_of(bare)
