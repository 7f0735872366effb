"""The writer on real PostgreSQL: a row the database refuses never blocks the others (what
`onthejob spool replay` does with it: tests/integration/test_spool_replay.py, on both databases)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest

from proxy.base.record import CallRecord
from proxy.recording.recorder import Recorder
from store import db
from tests.support.records import count_calls

pytestmark = [pytest.mark.postgres]


def _record(i: int, **extra) -> CallRecord:
    record = CallRecord(
        id=f"call{i:028d}",
        api="chat.completions",
        session_key=None,
        started_at=time.time(),
        status="error",
        http_status=502,
        request={"messages": [{"role": "user", "content": f"q{i}\x00"}]},
        chat_messages=[{"role": "user", "content": f"q{i}\x00"}],
    )
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_refused_rows_are_set_aside_and_the_rest_written(pg_url: str, tmp_path: Path) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)

    async def run() -> Recorder:
        recorder = Recorder(
            engine, tmp_path / "spool.jsonl", idle_timeout=60, flush_interval=0.01, batch_calls=100
        )
        await recorder.start()
        recorder.record(_record(0, model="m" * 600))  # longer than the column: trimmed
        recorder.record(_record(1, http_status=10**12))  # out of range: refused
        recorder.record(_record(2))
        await recorder.close()
        return recorder

    try:
        recorder = asyncio.run(run())
        assert count_calls(engine) == 2
        status = recorder.status()
        assert (status["rejected"], status["written"], status["backlog_calls"]) == (1, 2, 0)
        (kept,) = [orjson.loads(line) for line in recorder.rejected_path.read_bytes().splitlines()]
        assert kept["rows"]["calls"][0]["id"] == _record(1).id
        assert "out of range" in kept["error"]
    finally:
        engine.dispose()
