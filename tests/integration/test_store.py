"""The store on both databases: Alembic owns the schema, batch writes are idempotent."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, inspect, select

from store import db, recording
from store.models import Base, Call, Trajectory
from tests.support.store_rows import call_batch


def test_migrations_create_exactly_the_models_tables(db_url: str) -> None:
    db.upgrade(db_url)
    assert db.current_revision(db_url) == db.head_revision()
    engine = db.make_engine(db_url)
    try:
        inspector = inspect(engine)
        for table in Base.metadata.sorted_tables:
            columns = {c["name"] for c in inspector.get_columns(table.name)}
            assert columns == set(table.columns.keys()), table.name
            # ix_*: the indexes the models declare (not those backing unique constraints)
            indexes = {i["name"] for i in inspector.get_indexes(table.name)}
            assert {n for n in indexes if n.startswith("ix_")} == {i.name for i in table.indexes}, (
                table.name
            )
    finally:
        engine.dispose()
    db.upgrade(db_url)  # a second upgrade is a no-op


def test_replaying_a_batch_changes_nothing(engine: Engine) -> None:
    now = time.time()
    batch = call_batch(now)
    # live batches are written "fresh" (COPY on PostgreSQL); the spool replays batches
    # that may already be in
    for fresh in (True, False):
        with engine.begin() as conn:
            recording.write_batch(conn, **batch, fresh=fresh)
    with engine.connect() as conn:
        assert conn.execute(select(Call.id)).scalars().all() == ["c1"]
        call = recording.call_by_id(conn, call_id="c1")
        assert call is not None
        assert call["request"]["messages"][0]["content"] == "héllo"
        assert call["choices"] == batch["calls"][0]["choices"]
        assert call["prompt_token_suffix"] == [1, 2, 3]
        assert call["capture_complete"] is True and call["ttft_ms"] is None
        assert conn.execute(select(Trajectory.id)).scalars().all() == ["t1"]


def test_trajectory_last_call_only_moves_forward(engine: Engine) -> None:
    now = time.time()
    batch = call_batch(now)
    later = dict(batch["trajectories"][0], last_call_at=now + 60)
    with engine.begin() as conn:
        recording.write_batch(conn, **batch)
        recording.write_batch(conn, trajectories=[later], calls=[])
        recording.write_batch(conn, **batch)  # an older replayed batch must not move it back
        last = conn.execute(select(Trajectory.last_call_at)).scalar_one()
    if last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    assert abs(last.timestamp() - (now + 60)) < 1e-3


def test_finish_idle_and_open_lookup(engine: Engine) -> None:
    now = time.time()
    with engine.begin() as conn:
        recording.write_batch(conn, **call_batch(now - 600))
        found = recording.open_trajectory_for_session(conn, session_key="s")
        assert found is not None and found["id"] == "t1"
        cutoff = datetime.now(UTC) - timedelta(seconds=300)
        assert recording.finish_idle(conn, idle_before=cutoff) == 1
        assert recording.open_trajectory_for_session(conn, session_key="s") is None
        assert conn.execute(select(Trajectory.status)).scalar_one() == "finished"


def _renamed(batch: dict, suffix: str) -> dict:
    trajectory = {**batch["trajectories"][0], "id": "t" + suffix, "session_key": "s" + suffix}
    call = {**batch["calls"][0], "id": "c" + suffix, "trajectory_id": "t" + suffix}
    return {"trajectories": [trajectory], "calls": [call], "finished": []}


def test_the_writers_bulk_path_stores_what_sqlalchemy_stores(engine: Engine) -> None:
    now = time.time()
    bulk = _renamed(call_batch(now), "-bulk")
    bulk["trajectories"][0]["new"] = True  # PostgreSQL: COPY
    # a later batch's type never replaces the first call's
    later = {**bulk["trajectories"][0], "new": False, "last_call_at": now + 5, "task_key": "k"}
    later["interaction_type"] = "later"
    plain = _renamed(call_batch(now), "-plain")
    plain_later = {**plain["trajectories"][0], "last_call_at": now + 5, "task_key": "k"}
    plain_later["interaction_type"] = "later"
    for batch in (bulk, plain):
        batch["trajectories"][0]["interaction_type"] = "first"
    with engine.begin() as conn:
        recording.write_batch(conn, **bulk, fresh=True)
        recording.write_batch(conn, trajectories=[later], calls=[], fresh=True)  # upsert
        recording.write_batch(conn, **plain)
        recording.write_batch(conn, trajectories=[plain_later], calls=[])
        recording.finish_trajectories(
            conn, finished=[{"id": t, "ended_at": now + 6} for t in ("t-bulk", "t-plain")]
        )
    with engine.connect() as conn:
        calls = {r["id"]: r for r in (dict(x._mapping) for x in conn.execute(select(Call)))}
        trajectories = {
            r["id"]: r for r in (dict(x._mapping) for x in conn.execute(select(Trajectory)))
        }

    def same(a: dict, b: dict, differ: set[str]) -> None:
        assert {k: v for k, v in a.items() if k not in differ} == {
            k: v for k, v in b.items() if k not in differ
        }

    same(calls["c-bulk"], calls["c-plain"], {"id", "trajectory_id"})
    same(trajectories["t-bulk"], trajectories["t-plain"], {"id", "session_key"})
    assert trajectories["t-bulk"]["status"] == "finished"
    assert trajectories["t-bulk"]["task_key"] == "k"  # filled in once it is known
    assert trajectories["t-bulk"]["interaction_type"] == "first"
    last = trajectories["t-bulk"]["last_call_at"]
    last = last if last.tzinfo else last.replace(tzinfo=UTC)
    assert abs(last.timestamp() - (now + 5)) < 1e-3
