"""proxy.recording.calllog: the append-only log every answered call waits in until it is in
the DB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.recording.calllog import CallLog, LogLocked


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[CallLog]:
    log = CallLog(tmp_path / "log", segment_bytes=64)
    log.open()
    yield log
    log.close()


def lines(n: int, start: int = 0) -> list[bytes]:
    return [b'{"n": %d, "pad": "xxxxxxxxxx"}' % i for i in range(start, start + n)]


def append_all(log: CallLog, items: list[bytes]) -> None:
    for item in items:
        assert log.append(item + b"\n")


def read_all(log: CallLog, start: tuple[int, int] | None = None) -> list[bytes]:
    got, _ = log.read(start or log.committed, max_lines=10_000, max_bytes=1 << 20)
    return got


def test_lines_come_back_in_order_across_segments(opened: CallLog) -> None:
    append_all(opened, lines(10))

    assert read_all(opened) == lines(10)
    assert len(list(opened.directory.glob("*.log"))) > 2  # 64-byte segments rotated


def test_reads_are_bounded_in_lines_and_resume_where_they_stopped(opened: CallLog) -> None:
    append_all(opened, lines(10))

    first, after = opened.read(opened.committed, max_lines=4, max_bytes=1 << 20)
    rest, end = opened.read(after, max_lines=100, max_bytes=1 << 20)

    assert first + rest == lines(10) and len(first) == 4
    assert end == opened.end
    assert opened.read(end, max_lines=100, max_bytes=1 << 20) == ([], end)


def test_a_line_longer_than_max_bytes_is_still_read_whole(tmp_path: Path) -> None:
    log = CallLog(tmp_path / "log")
    log.open()
    try:
        big = b"x" * 200_000
        append_all(log, [big, b"small"])

        got, _ = log.read(log.committed, max_lines=10, max_bytes=1000)
        assert got[0] == big
    finally:
        log.close()


def test_commit_deletes_spent_segments_and_a_reopened_log_resumes_there(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = CallLog(directory, segment_bytes=64)
    log.open()
    append_all(log, lines(10))
    _, after = log.read(log.committed, max_lines=6, max_bytes=1 << 20)
    log.commit(after)
    segments_left = len(list(directory.glob("*.log")))
    log.close()

    reopened = CallLog(directory, segment_bytes=64)
    reopened.open()
    try:
        assert segments_left < 10
        assert read_all(reopened) == lines(4, start=6)
        append_all(reopened, lines(2, start=10))
        assert read_all(reopened) == lines(6, start=6)
        assert reopened.bytes_between(reopened.committed, reopened.end) == sum(
            len(x) + 1 for x in lines(6, start=6)
        )
    finally:
        reopened.close()


def test_a_line_torn_by_a_crash_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = CallLog(directory)
    log.open()
    append_all(log, lines(2))
    log.close()
    (segment,) = directory.glob("*.log")
    with open(segment, "ab") as handle:
        handle.write(b'{"n": 2, "pa')  # the machine died mid-write

    reopened = CallLog(directory)
    reopened.open()
    try:
        append_all(reopened, lines(1, start=3))
        assert read_all(reopened) == lines(2) + lines(1, start=3)
    finally:
        reopened.close()


def test_a_second_process_cannot_open_the_same_log(opened: CallLog) -> None:
    with pytest.raises(LogLocked, match="another proxy"):
        CallLog(opened.directory).open()


def test_sync_makes_appends_durable_and_counts_disk_bytes(opened: CallLog) -> None:
    append_all(opened, lines(3))
    opened.sync()

    assert opened.disk_bytes() == sum(len(x) + 1 for x in lines(3))
    assert opened.lines_between(opened.committed, opened.end) == 3
