"""The recorder on real databases: call log -> writer -> SQLite / PostgreSQL.

What a kill -9 of the whole proxy does is drilled in tests/integration/test_load_drill.py; here the
pieces: calls land once, the backlog lives in the log while the database is away, a crash
between a commit and its checkpoint writes nothing twice, and a schema that is behind holds
calls back instead of refusing them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, func, select

from proxy.base.capture import Capture, ChoiceCapture
from proxy.base.record import CallRecord
from proxy.recording.recorder import Recorder, log_directory
from proxy.recording.spool import Spool
from proxy.recording.stitching import new_id
from store import db
from store.models import Call, Trajectory
from tests.support.records import count_calls, export
from tests.support.store_rows import call_batch as store_batch
from tests.support.tcp_gate import through_gate


def call(i: int, session_key: str | None = None) -> CallRecord:
    messages = [{"role": "user", "content": f"question {i}"}]
    reply = {"role": "assistant", "content": "answer"}
    capture = Capture(
        prompt_token_ids=[1, 2, 3, i],
        choices=[
            ChoiceCapture(
                index=0,
                token_ids=[7, 8],
                logprobs=[-0.5, -0.25],
                finish_reason="stop",
                message=reply,
            )
        ],
        prompt_tokens=4,
        completion_tokens=2,
    )
    return CallRecord(
        id=new_id(),
        api="chat.completions",
        session_key=session_key,
        started_at=time.time(),
        request={"model": "m", "messages": messages},
        response={"choices": [{"index": 0, "message": reply}]},
        chat_messages=messages,
        model="m",
        capture=capture,
        latency_ms=2.0,
    )


def recorder(engine: Engine, spool: Path, **options: Any) -> Recorder:
    options.setdefault("batch_calls", 100)
    return Recorder(engine, spool, idle_timeout=300, flush_interval=0.01, **options)


async def until(predicate: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Poll (bounded) until predicate() holds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never reached: {what}")
        await asyncio.sleep(0.02)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


def count_trajectories(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Trajectory)).scalar_one())


def test_calls_reach_the_database_once_with_their_trajectories(
    engine: Engine, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"

    async def body() -> None:
        rec = recorder(engine, spool)
        await rec.start()
        for i in range(250):
            rec.record(call(i, session_key="s" if i % 2 else None))
        await until(
            lambda: rec.status()["backlog_calls"] == 0 and rec.status()["queue_depth"] == 0,
            "all written",
        )
        assert rec.status()["written"] == 250  # each once
        await rec.close()

    run(body)
    assert count_calls(engine) == 250
    assert count_trajectories(engine) == 126  # one session, 125 key-less calls
    trajectories = export(engine)
    assert all(c["capture_complete"] for t in trajectories for c in t["calls"])
    assert max(len(t["calls"]) for t in trajectories) == 125


def conversation(turns: int, session_key: str | None = None) -> list[CallRecord]:
    """One conversation's calls: each sends back the earlier messages and replies (so it is
    stitched, and its prompt stored as a delta)."""
    out, messages, prompt = [], [], [1, 2, 3]
    for turn in range(turns):
        messages = [*messages, {"role": "user", "content": f"turn {turn}"}]
        reply = {"role": "assistant", "content": f"reply {turn}", "tool_calls": None}
        record = call(turn, session_key)
        record.request = {"model": "m", "messages": list(messages), "temperature": 0.5}
        record.chat_messages = record.request["messages"]
        assert record.capture is not None
        record.capture.prompt_token_ids = [*prompt, 10 + turn]
        record.capture.choices[0].message = reply
        record.response = {"choices": [{"index": 0, "message": reply}], "usage": {"n": turn}}
        record.sampling = {"temperature": 0.5, "top_p": 1.0}
        record.user_agent = "agent/1.0\x00"  # a NUL: cleaned the same way on both paths
        out.append(record)
        prompt = [*record.capture.prompt_token_ids, 7, 8]
        messages = [*messages, reply]
    return out


def stored(engine: Engine) -> list[dict[str, Any]]:
    """Every calls row as stored, in order, its trajectory as the index of the trajectory
    in order of first appearance (ids differ from run to run), with that trajectory's row."""
    with engine.connect() as conn:
        calls = [dict(r._mapping) for r in conn.execute(select(Call.__table__))]
        trajectories = {r.id: dict(r._mapping) for r in conn.execute(select(Trajectory.__table__))}
    calls.sort(key=lambda c: (c["started_at"], c["id"]))
    first: dict[str, int] = {}
    for c in calls:
        trajectory = dict(trajectories[c["trajectory_id"]])
        c["trajectory_id"] = first.setdefault(trajectory.pop("id"), len(first))
        c["trajectory"] = trajectory
    return calls


def test_conversations_read_back_from_the_log_are_stitched_and_stored_as_deltas(
    tmp_path: Path,
) -> None:
    records = conversation(6) + conversation(4, session_key="s") + [call(i) for i in range(20)]
    url = f"sqlite:///{tmp_path / 'log.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)

    async def body() -> None:
        rec = recorder(engine, tmp_path / "spool.jsonl")
        await rec.start()
        for record in records:
            rec.record(record)
        await until(lambda: rec.status()["backlog_calls"] == 0, "all written")
        await rec.close()

    try:
        run(body)
        rows = stored(engine)
    finally:
        engine.dispose()
    assert len(rows) == len(records)
    assert max(c["trajectory_id"] for c in rows) == 1 + 20  # two conversations + 20
    later_turns = [c for c in rows if c["prompt_parent_id"] is not None]
    assert len(later_turns) == 5 + 3  # every turn after a conversation's first
    assert all(c["prompt_prefix_len"] > 0 for c in later_turns)
    assert {c["user_agent"] for c in rows if c["user_agent"]} == {"agent/1.0\ufffd"}
    assert all(c["sampling"] == {"temperature": 0.5, "top_p": 1.0} for c in later_turns)


def test_idle_time_counts_from_the_end_of_a_call_not_its_start(
    engine: Engine, tmp_path: Path
) -> None:
    """A 100 s call, then 30 s of tool time, then the next call, with a 60 s idle timeout:
    130 s after the first call started, but one session (issue 14, item 8)."""
    started = time.time() - 131
    long_call, next_call = call(0, session_key="s"), call(1, session_key="s")
    long_call.started_at, long_call.latency_ms = started, 100_000.0
    next_call.started_at, next_call.latency_ms = started + 130, 500.0

    async def body() -> None:
        rec = Recorder(engine, tmp_path / "spool.jsonl", idle_timeout=60, flush_interval=0.01)
        await rec.start()
        rec.record(long_call)
        rec.record(next_call)
        await until(lambda: rec.status()["written"] == 2, "both written")
        await rec.close()

    run(body)
    (trajectory,) = export(engine)
    assert [c["id"] for c in trajectory["calls"]] == [long_call.id, next_call.id]
    with engine.connect() as conn:
        last_call_at = conn.execute(select(Trajectory.last_call_at)).scalar_one()
    if last_call_at.tzinfo is None:  # SQLite
        last_call_at = last_call_at.replace(tzinfo=UTC)
    assert last_call_at.timestamp() == pytest.approx(started + 130.5, abs=1e-3)


def test_a_trajectory_that_ended_with_an_answer_is_finished_on_the_shorter_clock(
    engine: Engine, tmp_path: Path
) -> None:
    """A call answered in full (no tool call pending) is finished after
    --answered-idle-timeout; one whose reply asked for a tool keeps --idle-timeout: its
    harness may be running the tool."""
    answered, asks_tool = call(0, session_key="answered"), call(1, session_key="tool")
    assert asks_tool.capture is not None
    asks_tool.capture.choices[0].finish_reason = "tool_calls"

    def statuses() -> dict[str | None, str]:
        with engine.connect() as conn:
            rows = conn.execute(select(Trajectory.session_key, Trajectory.status)).all()
        return {key: status for key, status in rows}

    async def body() -> None:
        rec = Recorder(
            engine,
            tmp_path / "spool.jsonl",
            idle_timeout=300,
            answered_idle_timeout=0.5,
            flush_interval=0.01,
        )
        await rec.start()
        rec.record(answered)
        rec.record(asks_tool)
        await until(lambda: statuses().get("answered") == "finished", "the answer finished")
        await rec.close()

    run(body)
    assert statuses() == {"answered": "finished", "tool": "open"}


def test_a_spool_left_by_an_older_proxy_is_written_once_then_emptied(
    engine: Engine, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    old = Spool(spool)
    for _ in range(2):  # the same batch twice: a replay that died half-way
        old.append(store_batch(time.time()))

    async def body() -> None:
        rec = recorder(engine, spool)
        await rec.start()
        await until(lambda: old.size() == 0, "the spool replayed and emptied")
        await rec.close()

    run(body)
    assert count_calls(engine) == 1 and count_trajectories(engine) == 1
    assert list(old.batches()) == []


def test_a_crash_between_commit_and_checkpoint_writes_nothing_twice(
    engine: Engine, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"

    async def first_run() -> None:
        rec = recorder(engine, spool)
        await rec.start()
        for i in range(40):
            rec.record(call(i))
        await rec.close()

    run(first_run)
    # as if the process died after the database committed but before the checkpoint moved
    (segment,) = sorted(log_directory(spool).glob("*.log"))
    checkpoint = log_directory(spool) / "committed"
    checkpoint.write_text(f"{int(segment.stem):012d} {0:015d}\n")

    async def second_run() -> None:
        rec = recorder(engine, spool)
        await rec.start()
        # counted at start; the live figure may already be falling, the writer is running
        assert rec.backlog_at_start == 40
        rec.record(call(40))
        await until(lambda: rec.status()["backlog_calls"] == 0, "replayed")
        await rec.close()

    run(second_run)
    assert count_calls(engine) == 41
    assert count_trajectories(engine) == 41  # no orphan trajectory from the replay


@pytest.mark.postgres
def test_while_the_database_is_away_calls_wait_in_the_log_not_in_memory(
    pg_url: str, tmp_path: Path
) -> None:
    db.upgrade(pg_url)
    gated_url, gate = through_gate(pg_url)  # shut: the database is unreachable
    gated = db.make_engine(gated_url, connect_timeout=1)
    engine = db.make_engine(pg_url)

    async def body() -> None:
        rec = recorder(gated, tmp_path / "spool.jsonl", batch_calls=50)
        await rec.start()
        for i in range(2000):
            rec.record(call(i))
        await until(lambda: rec.status()["database"] == "unreachable", "writer sees the outage")
        status = rec.status()
        # the batch being retried is all that is in memory: 50 calls at most
        assert status["queue_depth"] <= status["queue_limit_calls"] == 50
        assert status["backlog_calls"] == 2000 and status["backlog_bytes"] > 0
        assert status["log_bytes"] >= status["backlog_bytes"]
        gate.open()
        await until(lambda: rec.status()["backlog_calls"] == 0, "backlog written", within=60)
        assert rec.status()["database"] == "ok"
        await rec.close()

    try:
        run(body)
        assert count_calls(engine) == 2000
    finally:
        gate.shut()
        gated.dispose()
        engine.dispose()


def test_a_schema_behind_holds_calls_until_it_is_upgraded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    db.upgrade(url, "0001")
    engine = db.make_engine(url)

    async def body() -> None:
        rec = recorder(engine, tmp_path / "spool.jsonl", check_schema=True)
        await rec.start()
        for i in range(10):
            rec.record(call(i))
        await until(lambda: rec.status()["database"] == "unreachable", "schema refused")
        assert rec.status()["backlog_calls"] == 10 and rec.status()["rejected"] == 0
        await asyncio.to_thread(db.upgrade, url)
        await until(lambda: rec.status()["backlog_calls"] == 0, "written after the upgrade")
        await rec.close()

    try:
        run(body)
        assert count_calls(engine) == 10
    finally:
        engine.dispose()


def test_a_schema_taken_back_under_a_running_writer_holds_calls_instead_of_refusing_them(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """A column the rows need is gone (the schema was downgraded after the proxy started):
    the rows are fine, so they wait in the log, none is set aside as refused."""

    async def body() -> None:
        rec = recorder(engine, tmp_path / "spool.jsonl")
        await rec.start()
        rec.record(call(0))
        await until(lambda: rec.status()["written"] == 1, "first call written")
        # 0011 added calls.sampling, which every row names; a later migration that leaves
        # calls alone must not change what this test takes back (hence no "-1")
        await asyncio.to_thread(command.downgrade, db.alembic_config(db_url), "0010")
        for i in range(1, 6):
            rec.record(call(i))
        await until(lambda: rec.status()["database"] == "unreachable", "schema refused")
        assert rec.status()["backlog_calls"] == 5 and rec.status()["rejected"] == 0
        await asyncio.to_thread(db.upgrade, db_url)
        await until(lambda: rec.status()["backlog_calls"] == 0, "written after the upgrade")
        assert rec.status()["rejected"] == 0
        await rec.close()

    run(body)
    assert count_calls(engine) == 6
    assert not (tmp_path / "spool.jsonl.rejected").exists()


def test_a_backlog_ending_on_a_segment_boundary_is_written_and_the_writer_stops(
    engine: Engine, tmp_path: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    away = db.make_engine(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}")

    async def while_away() -> None:
        rec = recorder(away, spool)
        await rec.start()
        for i in range(100):
            rec.record(call(i))
        await until(lambda: rec.status()["database"] == "unreachable", "the database is away")
        await rec.close()

    async def back() -> None:
        rec = recorder(engine, spool, batch_calls=100)  # one batch ends at the segment's end
        await rec.start()
        await until(lambda: rec.status()["backlog_calls"] == 0, "the backlog written")
        await asyncio.wait_for(rec.close(), timeout=10)

    run(while_away)
    away.dispose()
    run(back)
    assert count_calls(engine) == 100
