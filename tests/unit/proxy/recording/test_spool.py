"""proxy.recording.spool: the append-only file records wait in while the database is down."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.recording.spool import Spool

FIRST = {"calls": [{"id": "c1", "text": "héllo ✓"}], "trajectories": [], "finished": []}
SECOND = {"calls": [{"id": "c2", "prompt": [1, 2, 3]}], "trajectories": [{"id": "t"}]}


def test_empty_spool(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "missing.jsonl")

    assert spool.size() == 0
    assert list(spool.batches()) == []


def test_append_then_batches_roundtrip(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "deep" / "dir" / "spool.jsonl")

    spool.append(FIRST)
    spool.append(SECOND)

    assert list(spool.batches()) == [FIRST, SECOND]
    assert spool.size() == len(orjson.dumps(FIRST)) + len(orjson.dumps(SECOND)) + 2


def test_batches_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    Spool(path).append(FIRST)

    restarted = Spool(path)
    restarted.append(SECOND)

    assert list(Spool(path).batches()) == [FIRST, SECOND]


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    Spool(path).append(FIRST)
    with open(path, "ab") as handle:
        handle.write(orjson.dumps(SECOND)[:17])  # the crash came mid-write

    assert list(Spool(path).batches()) == [FIRST]


def test_clear_empties_the_file_and_it_is_usable_again(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append(FIRST)

    spool.clear()

    assert spool.size() == 0
    assert list(spool.batches()) == []
    spool.append(SECOND)
    assert list(spool.batches()) == [SECOND]


def test_a_batch_appended_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    Spool(path).append(FIRST)
    with open(path, "ab") as handle:
        handle.write(b'{"calls": [{"id"')

    Spool(path).append(SECOND)  # after the restart, with the database still down

    assert list(Spool(path).batches()) == [FIRST, SECOND]


def test_appending_to_an_intact_file_adds_no_blank_line(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    Spool(path).append(FIRST)

    Spool(path).append(SECOND)

    assert path.read_bytes() == orjson.dumps(FIRST) + b"\n" + orjson.dumps(SECOND) + b"\n"


def test_appending_to_an_existing_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    path.touch()

    Spool(path).append(FIRST)

    assert path.read_bytes() == orjson.dumps(FIRST) + b"\n"
