"""The writer on real PostgreSQL: a row the database refuses never blocks the others, and
`onthejob spool replay` writes it once its cause is fixed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from sqlalchemy import text

from proxy.recording import CallRecord, Recorder
from proxy.store import db
from tests.records import count_calls
from tests.test_cli import onthejob

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


def test_spool_replay_writes_refused_rows_once_their_cause_is_fixed(
    pg_url: str, tmp_path: Path
) -> None:
    db.upgrade(pg_url)
    engine = db.make_engine(pg_url)
    spool = tmp_path / "spool.jsonl"
    with engine.begin() as conn:  # an operator's rule the proxy's rows break
        conn.execute(text("ALTER TABLE calls ADD CONSTRAINT no_m CHECK (model <> 'banned')"))

    async def run() -> Recorder:
        recorder = Recorder(engine, spool, idle_timeout=60, flush_interval=0.01, batch_calls=100)
        await recorder.start()
        for i, model in enumerate(["ok", "banned", "ok"]):
            recorder.record(_record(i, model=model))
        await recorder.close()
        return recorder

    try:
        recorder = asyncio.run(run())
        assert count_calls(engine) == 2 and recorder.status()["rejected"] == 1

        still = onthejob("spool", "replay", "--db", pg_url, "--spool", str(spool))
        assert still.returncode == 1 and "0 rows written, 1 still refused" in still.stdout
        assert "no_m" in still.stdout
        assert count_calls(engine) == 2 and recorder.rejected_path.exists()

        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE calls DROP CONSTRAINT no_m"))
        fixed = onthejob("spool", "replay", "--db", pg_url, "--spool", str(spool))
        assert fixed.returncode == 0 and "1 rows written, 0 still refused" in fixed.stdout
        assert count_calls(engine) == 3 and not recorder.rejected_path.exists()
        again = onthejob("spool", "replay", "--db", pg_url, "--spool", str(spool))
        assert again.returncode == 0 and "0 rows written, 0 still refused" in again.stdout
    finally:
        engine.dispose()
