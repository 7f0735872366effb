"""The call log: where every answered call waits until it is in the database.

One JSON line per call, in numbered segment files in one directory. The event loop appends
a call's line with a single write() before the call's answer ends, so a kill -9 of the
proxy loses nothing (the line is with the operating system); a background thread fsyncs
every `fsync_interval` seconds, which bounds what a crash of the whole machine can lose.
The writer reads the log in order and records in `committed` how far the database has it;
a segment is deleted once every call in it is in the database.

Invariant: lines are only appended, and only to a segment opened by this process, so a
line torn by a machine crash can only be the last one of an older segment.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("onthejob.calllog")

# (segment number, byte offset): where a line starts, or how far the log has been read
Position = tuple[int, int]

_SUFFIX = ".log"
_CHECKPOINT = "committed"
_CHECKPOINT_FORMAT = "{:012d} {:015d}\n"
_READ_CHUNK = 256 << 10


class LogLocked(RuntimeError):
    """Another process has this call log open."""


class CallLog:
    def __init__(
        self, directory: Path, *, fsync_interval: float = 0.1, segment_bytes: int = 64 << 20
    ) -> None:
        if fsync_interval <= 0:
            raise ValueError("fsync_interval must be > 0")
        self.directory = directory
        self.fsync_interval = fsync_interval
        self.segment_bytes = segment_bytes
        # sizes of the segments on disk; the one being appended to is at `end`
        self._sizes: dict[int, int] = {}
        self.end: Position = (1, 0)
        self.committed: Position = (1, 0)
        self._fd = -1
        self._lock_fd = -1
        self._checkpoint_fd = -1
        # fds of segments rotated away, fsynced and closed by the sync thread
        self._retired: list[int] = []
        self._guard = threading.Lock()
        self._appended = 0  # bytes appended (event loop); the sync thread compares
        self._synced = 0
        self._checkpoint_dirty = False
        self._directory_dirty = False
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        self._reader: tuple[int, BinaryIO] | None = None  # (segment, file) the writer reads
        self.write_errors = 0

    # -- lifecycle -----------------------------------------------------------------------
    def open(self) -> None:
        """Lock the directory, find what earlier runs left, start a fresh segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock()
        for path in self.directory.glob("*" + _SUFFIX):
            with contextlib.suppress(ValueError):
                self._sizes[int(path.name[: -len(_SUFFIX)])] = path.stat().st_size
        self.committed = self._read_checkpoint()
        for number in [n for n in self._sizes if n < self.committed[0]]:
            self._unlink(number)
        newest = max(self._sizes, default=self.committed[0] - 1)
        self._fd = self._create(newest + 1)
        self.end = (newest + 1, 0)
        if self.committed[0] not in self._sizes:
            self.committed = (min(self._sizes), 0)
        self._checkpoint_fd = os.open(
            self.directory / _CHECKPOINT, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        self._syncer = threading.Thread(target=self._sync_loop, name="calllog-fsync", daemon=True)
        self._syncer.start()

    def close(self) -> None:
        """fsync and release everything (the sync thread stops first)."""
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        self.sync()
        for fd in (self._fd, self._checkpoint_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._checkpoint_fd = -1
        self._close_reader()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    # -- event loop ----------------------------------------------------------------------
    def append(self, line: bytes) -> bool:
        """Write one line (ending in a newline); False if the operating system refused it."""
        segment, offset = self.end
        if offset >= self.segment_bytes:
            segment, offset = self._rotate(segment, offset)
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # only on a full disk or a signal; finish the line
                written += os.write(self._fd, line[written:])
        except OSError as exc:
            self.write_errors += 1
            log.error("call log write failed (%s); the call is kept in memory only", exc)
            self._fill_torn(segment, offset)
            return False
        self._appended += written
        self.end = (segment, offset + written)
        return True

    def _rotate(self, segment: int, offset: int) -> Position:
        # the old segment's final size first: a reader that sees the new `end` relies on it
        self._sizes[segment] = offset
        fd = self._create(segment + 1)
        with self._guard:
            self._retired.append(self._fd)
            self._fd = fd
        self.end = (segment + 1, 0)
        return self.end

    def _fill_torn(self, segment: int, offset: int) -> None:
        """After a failed write, end the segment at the last whole line: start a new one."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, offset)
        try:
            self.end = self._rotate(segment, offset)
        except OSError:
            pass  # the next append tries again

    # -- writer thread -------------------------------------------------------------------
    def read(
        self, start: Position, *, max_lines: int, max_bytes: int
    ) -> tuple[list[bytes], Position]:
        """Whole lines from `start` on (at most max_lines, about max_bytes), and where the
        next read starts. A torn last line of an older segment is skipped."""
        lines: list[bytes] = []
        size = 0
        position = start
        while len(lines) < max_lines and size < max_bytes:
            end = self.end
            if position >= end:
                break
            segment, offset = position
            limit = end[1] if segment == end[0] else self._sizes.get(segment, 0)
            if offset >= limit:
                if segment == end[0]:
                    break
                position = (self._next_segment(segment), 0)
                continue
            handle = self._open_reader(segment)
            handle.seek(offset)
            # at most _READ_CHUNK at a time: a backlog's batch of 500 calls is well under
            # max_bytes, and reading (and splitting) 8 MiB to keep 650 KB of it cost ~15 us
            # per call when the writer was behind
            data = handle.read(min(limit - offset, max(min(max_bytes - size, _READ_CHUNK), 1)))
            cut = data.rfind(b"\n") + 1
            while not cut and offset + len(data) < limit:  # one line longer than the chunk
                data += handle.read(min(limit - offset - len(data), 1 << 20))
                cut = data.rfind(b"\n") + 1
            if not cut:
                log.warning("call log segment %d ends in a torn line; skipped", segment)
                position = (segment, limit)
                continue
            wanted = max_lines - len(lines)
            chunk = data[:cut].split(b"\n", wanted)
            rest = chunk.pop()  # b"" after the last newline, or the lines past `wanted`
            cut -= len(rest)  # those are read again next time
            lines += chunk
            size += cut
            position = (segment, offset + cut)
        return lines, position

    def commit(self, position: Position) -> None:
        """Everything before `position` is in the database: note it, drop spent segments."""
        self.committed = position
        os.pwrite(self._checkpoint_fd, _CHECKPOINT_FORMAT.format(*position).encode(), 0)
        self._checkpoint_dirty = True
        for number in [n for n in list(self._sizes) if n < position[0]]:
            if self._reader is not None and self._reader[0] == number:
                self._close_reader()
            self._unlink(number)

    # -- figures -------------------------------------------------------------------------
    def bytes_between(self, start: Position, end: Position) -> int:
        if start >= end:
            return 0
        if start[0] == end[0]:
            return end[1] - start[1]
        sizes = dict(self._sizes)
        middle = sum(size for n, size in sizes.items() if start[0] < n < end[0])
        return sizes.get(start[0], 0) - start[1] + middle + end[1]

    def disk_bytes(self) -> int:
        return sum(size for n, size in dict(self._sizes).items() if n != self.end[0]) + self.end[1]

    def lines_between(self, start: Position, end: Position) -> int:
        """How many lines lie between two positions (read from disk: for start-up only)."""
        count = 0
        position = start
        while position < end:
            lines, after = self.read(position, max_lines=1 << 30, max_bytes=8 << 20)
            if after == position:
                break
            count += len(lines)
            position = after
        return count

    # -- sync thread ---------------------------------------------------------------------
    def sync(self) -> None:
        """fsync what was appended and the checkpoint; close segments rotated away."""
        with self._guard:
            retired, self._retired = self._retired, []
            current = self._fd
        appended = self._appended
        for fd in retired:
            with contextlib.suppress(OSError):
                os.fdatasync(fd)
            os.close(fd)
        if appended != self._synced and current >= 0:
            with contextlib.suppress(OSError):
                os.fdatasync(current)
            self._synced = appended
        if self._checkpoint_dirty and self._checkpoint_fd >= 0:
            self._checkpoint_dirty = False
            with contextlib.suppress(OSError):
                os.fdatasync(self._checkpoint_fd)
        if self._directory_dirty:
            self._directory_dirty = False
            self._sync_directory()

    def _sync_loop(self) -> None:
        while not self._stop.wait(self.fsync_interval):
            try:
                self.sync()
            except Exception:  # the thread must outlive a bad moment (e.g. a full disk)
                log.exception("call log fsync failed")

    # -- files ---------------------------------------------------------------------------
    def _path(self, number: int) -> Path:
        return self.directory / f"{number:012d}{_SUFFIX}"

    def _create(self, number: int) -> int:
        fd = os.open(
            self._path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        self._sizes[number] = 0
        self._directory_dirty = True
        return fd

    def _unlink(self, number: int) -> None:
        self._sizes.pop(number, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(number).unlink()
        self._directory_dirty = True

    def _next_segment(self, number: int) -> int:
        later = [n for n in list(self._sizes) if n > number]
        return min(later) if later else number + 1

    def _open_reader(self, number: int) -> BinaryIO:
        if self._reader is None or self._reader[0] != number:
            self._close_reader()
            self._reader = (number, open(self._path(number), "rb"))
        return self._reader[1]

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader[1].close()
            self._reader = None

    def _read_checkpoint(self) -> Position:
        try:
            text = (self.directory / _CHECKPOINT).read_text()
            segment, offset = (int(part) for part in text.split())
            return segment, offset
        except (FileNotFoundError, ValueError):
            return (min(self._sizes, default=1), 0)

    def _lock(self) -> None:
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"the call log {self.directory} is in use by another proxy; give each proxy "
                "its own --spool"
            ) from None
        self._lock_fd = fd

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
