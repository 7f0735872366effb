"""The writer: one thread that moves calls from the call log into the database.

It reads the log in order, builds a batch's rows once (trajectories, prompt deltas), writes
them in one transaction and then marks the log committed up to there. While the database is
unreachable (or its schema is behind) it keeps that one batch and retries; everything newer
waits in the log, on disk, not in memory. A row the database refuses is set aside in
`<spool>.rejected` and never holds up the rest.

Invariant: an entry reaches the row builder exactly once (the tracker depends on it); after
a crash, entries the database already holds are skipped before they reach it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
from sqlalchemy import Connection, Engine

from proxy.base.record import CallEntry
from proxy.recording.calllog import CallLog, Position
from proxy.recording.rows import RowBuilder, Rows, empty_rows, ended_at
from proxy.recording.spool import Spool
from proxy.recording.stitching import TrajectoryTracker
from store import db, recording
from store.errors import is_unreachable

log = logging.getLogger("onthejob.recording")

# how long a stopping writer keeps draining the log into a database that answers
DRAIN_SECONDS = 10.0
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


class Unreachable(Exception):
    """The database could not be reached, or cannot take rows yet (schema behind)."""


class Writer:
    def __init__(
        self,
        engine: Engine,
        calllog: CallLog,
        *,
        tracker: TrajectoryTracker,
        rejected: Spool,
        legacy_spool: Spool | None = None,
        flush_interval: float,
        batch_calls: int,
        batch_bytes: int,
        check_schema: bool = False,
    ) -> None:
        self.engine = engine
        self.log = calllog
        self.tracker = tracker
        self.rejected_spool = rejected
        self.legacy_spool = legacy_spool
        self.flush_interval = flush_interval
        self.batch_calls = batch_calls
        self.batch_bytes = batch_bytes
        self._schema_unchecked = check_schema
        self._prefetched: dict[str, tuple[str, float, float] | None] = {}
        self.builder = RowBuilder(tracker, find_open=self._prefetched.get)
        self.cursor: Position = calllog.committed
        # lines before here were logged by an earlier run: the database may have some
        self.replay_until: Position = calllog.end
        # entries the log could not take (e.g. a full disk): kept in memory, written first
        self.unlogged: collections.deque[CallEntry] = collections.deque()
        self.written = 0
        self.rejected = 0
        self.processed = 0  # lines taken from the log (written, rejected, skipped or torn)
        self.in_memory_calls = 0
        self.in_memory_bytes = 0
        self.unreachable: str | None = None
        # the time of the newest call written: the writer's clock while it is behind
        self.clock = 0.0
        self._stopping = threading.Event()
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None
        self._last_sweep = 0.0
        # the writer's own connection, kept from batch to batch: a pool checkout with its
        # pre-ping cost a round trip and ~0.3 ms of CPU per batch (dropped on any error)
        self._conn: Connection | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def stop(self, drain_seconds: float = DRAIN_SECONDS) -> None:
        """Drain what the log holds while the database answers (bounded), then stop."""
        self._drain_until = time.monotonic() + drain_seconds
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def caught_up(self) -> bool:
        return self.cursor >= self.log.end and not self.unlogged

    def _run(self) -> None:
        try:
            self._replay_legacy_spool()
            while self._step():
                pass
        except Exception:  # the thread must never die silently: the log keeps everything
            log.exception("the recording writer stopped; calls stay in the call log")
        finally:
            conn, self._conn = self._conn, None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _step(self) -> bool:
        """Write one batch (or sweep, or wait); False when it is time to stop."""
        # read back from the log, never taken as the objects the event loop logged: kept
        # alive across threads until the writer's turn, those cost the process ~19 us of
        # CPU a call (GC, memory) where parsing the lines again costs the writer ~7
        lines, after = self.log.read(
            self.cursor, max_lines=self.batch_calls, max_bytes=self.batch_bytes
        )
        logged, count, size = self._parse(lines), len(lines), sum(len(li) for li in lines)
        unlogged = [self.unlogged.popleft() for _ in range(len(self.unlogged))]
        stopping = self._stopping.is_set()
        if logged or unlogged:
            if not self._write_entries(unlogged + logged, count, size, after):
                return False  # stopping while the database is away: the log keeps them
        elif after != self.cursor:  # past the end of a spent segment, or torn lines only
            self.log.commit(after)
            self.cursor = after
            self.processed += count
        if time.monotonic() - self._last_sweep >= self._sweep_every():
            self._sweep()
        if stopping and (self.caught_up or time.monotonic() > self._drain_until):
            return False
        full = count >= self.batch_calls or size >= self.batch_bytes
        if not full:
            self._stopping.wait(self.flush_interval)
        return True

    # -- one batch -----------------------------------------------------------------------
    def _write_entries(
        self, entries: list[CallEntry], count: int, size: int, after: Position
    ) -> bool:
        """Write the entries of `count` log lines (`size` bytes) up to `after`."""
        self.in_memory_calls = len(entries)
        self.in_memory_bytes = size
        from_replay = self.cursor < self.replay_until
        rows: Rows | None = None
        attempt = 0
        while True:
            try:
                if rows is None:
                    entries = self._prepare(entries, from_replay)
                    rows = self.builder.rows(entries)
                self._write(rows, fresh=attempt == 0)
                break
            except Unreachable as exc:
                if self._stopping.is_set():
                    self.in_memory_calls = self.in_memory_bytes = 0
                    return False
                self._note_unreachable(str(exc))
                self._stopping.wait(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
                attempt += 1
        if self.unreachable is not None:
            log.info("database reachable again; writing the calls the log kept")
            self.unreachable = None
        if entries:
            self.clock = max(self.clock, max(ended_at(e) for e in entries))
        self.log.commit(after)
        self.cursor = after
        self.processed += count
        self.in_memory_calls = self.in_memory_bytes = 0
        return True

    def _parse(self, lines: list[bytes]) -> list[CallEntry]:
        entries = []
        for line in lines:
            try:
                entries.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                if line.strip(b"\x00 \t\r"):
                    log.warning("call log line torn by a crash; skipped (%d bytes)", len(line))
        return entries

    def _prepare(self, entries: list[CallEntry], from_replay: bool) -> list[CallEntry]:
        """Before rows are built (the tracker sees each entry once): drop entries already in
        the database (after a crash), and fetch the open trajectories of sessions this
        process does not know yet (after a restart). Raises Unreachable."""
        self._check_schema()
        self._prefetched.clear()
        known = self.tracker.knows_session
        keys = {e["session_key"] for e in entries if e["session_key"] is not None}
        keys = {key for key in keys if not known(key)}
        if not (from_replay or keys):
            return entries  # nothing to ask the database
        try:
            with self._transaction() as conn:
                if from_replay:
                    present = recording.existing_call_ids(conn, ids=[e["id"] for e in entries])
                    entries = [e for e in entries if e["id"] not in present]
                if keys:
                    found = recording.open_trajectories_for_sessions(
                        conn, session_keys=sorted(keys)
                    )
                    self._prefetched.update(
                        {
                            key: (row["id"], _epoch(row["started_at"]), _epoch(row["last_call_at"]))
                            for key, row in found.items()
                        }
                    )
        except Exception as exc:
            if is_unreachable(exc):
                raise Unreachable(short_reason(exc)) from exc
            raise
        return entries

    def _check_schema(self) -> None:
        if not self._schema_unchecked:
            return
        try:
            current, head = db.current_revision_of(self.engine), db.head_revision()
        except Exception as exc:
            if is_unreachable(exc):
                raise Unreachable(short_reason(exc)) from exc
            raise
        if current != head:
            raise Unreachable(
                f"schema at {current}, code expects {head}: run `onthejob db upgrade`"
            )
        self._schema_unchecked = False

    def _write(self, rows: Rows, *, fresh: bool) -> None:
        """Write a batch; a row the database refuses is set aside, never blocks the rest.

        Raises Unreachable when the database cannot be reached (the caller retries).
        """
        try:
            with self._transaction() as conn:
                recording.write_batch(conn, **rows, fresh=fresh)
            self.written += len(rows["calls"])
            return
        except Exception as exc:
            if is_unreachable(exc):
                raise Unreachable(short_reason(exc)) from exc
            log.error(
                "database refused a batch (%s); writing its rows one by one", short_reason(exc)
            )
        for single in _singles(rows):
            try:
                with self._transaction() as conn:
                    recording.write_batch(conn, **single)
                self.written += len(single["calls"])
            except Exception as exc:
                if is_unreachable(exc):
                    raise Unreachable(short_reason(exc)) from exc
                self._reject(single, exc)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One transaction on the writer's connection (made when there is none)."""
        conn = self._conn
        if conn is None or conn.closed or conn.invalidated:
            conn = self._conn = self.engine.connect()
        try:
            with conn.begin():
                yield conn
        except BaseException:
            self._drop_connection()
            raise

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()  # never back to the pool: it may be broken
                conn.close()

    def _reject(self, rows: Rows, exc: BaseException) -> None:
        """Keep a refused row beside the log (`onthejob spool replay` retries it)."""
        self.rejected_spool.append({"error": short_reason(exc), "rows": rows})
        self.rejected += len(rows["calls"]) or len(rows["trajectories"])
        log.error(
            "database refused a row (%s); kept in %s", short_reason(exc), self.rejected_spool.path
        )

    def _note_unreachable(self, reason: str) -> None:
        if self.unreachable is None:
            log.warning("database unreachable (%s); calls wait in the call log", reason)
        self.unreachable = reason

    # -- trajectories that went idle -----------------------------------------------------
    def _sweep_every(self) -> float:
        return min(self.tracker.answered_timeout, 5.0) / 2

    def _sweep(self) -> None:
        """Finish trajectories idle past the timeout: those this process tracks, and (by
        time, in the database) those of earlier runs and other proxies."""
        self._last_sweep = time.monotonic()
        # behind, the writer's clock is the newest call it wrote: a backlog must not
        # finish the trajectories its own calls continue
        now = time.time() if self.caught_up else self.clock
        finished = [
            {"id": state.id, "ended_at": state.last_call_at} for state in self.tracker.expire(now)
        ]
        if self.unreachable is not None:
            return
        cutoff = now - self.tracker.idle_timeout - 10 * self.flush_interval - 5
        try:
            with self._transaction() as conn:
                recording.finish_trajectories(conn, finished=finished)
                recording.finish_idle(conn, idle_before=datetime.fromtimestamp(cutoff, UTC))
        except Exception as exc:  # finish_idle finishes them on a later sweep
            log.warning("could not finish idle trajectories (%s)", short_reason(exc))

    # -- the spool of older versions -----------------------------------------------------
    def _replay_legacy_spool(self) -> None:
        """Row batches an older proxy spooled while the database was away."""
        spool = self.legacy_spool
        if spool is None or not spool.size():
            return
        replayed = 0
        attempt = 0
        for rows in spool.batches():
            rows = {**empty_rows(), **rows}
            while True:
                try:
                    self._write(rows, fresh=False)  # may be in already: idempotent inserts
                    break
                except Unreachable as exc:
                    if self._stopping.is_set():
                        return
                    self._note_unreachable(str(exc))
                    self._stopping.wait(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
                    attempt += 1
            replayed += 1
        spool.clear()
        log.info("replayed %d batches from the spool %s", replayed, spool.path)


def _singles(rows: Rows) -> list[Rows]:
    """A batch split into one-row batches; trajectories first (calls refer to them)."""
    out = []
    for key in ("trajectories", "calls", "responses", "finished"):
        for row in rows.get(key, []):
            single = empty_rows()
            single[key] = [row]
            out.append(single)
    return out


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:  # SQLite hands back naive datetimes; we store UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def short_reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]
