"""The command line: help is true, db and export work on a real database."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from sqlalchemy import Engine, text

from learner.swap.lease import OUTLASTS_TTL, TTL
from learner.vllm_server import free_port
from store import db, recording
from tests.support.cli import onthejob


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["serve"],
        ["export"],
        ["db", "upgrade"],
        ["demo"],
        ["spool", "replay"],
        ["learn"],
        ["rollout"],
        ["rollback"],
    ],
)
def test_help_lists_every_option(command: list[str]) -> None:
    result = onthejob(*command, "--help")
    assert result.returncode == 0, result.stderr
    if command == ["serve"]:
        for option in (
            "--upstream",
            "--host",
            "--port",
            "--db",
            "--idle-timeout",
            "--spool",
            "--stream-tools-mode",
            "--max-body-bytes",
            "--upstream-timeout",
            "--upstream-retry-after",
            "--fanout",
            "--log-fsync-interval",
            "--migrate",
            "--hosted-tools",
            "--require-keys",
        ):
            assert option in result.stdout
        assert "client key" in result.stdout and "/admin/api/keys" in result.stdout
    if command == ["learn"]:
        assert "--keys" in result.stdout and "--guard" in result.stdout
    if command == ["rollout"]:
        for option in ("--tasks", "--curriculum", "--max-rounds", "--minutes", "--step-wait"):
            assert option in result.stdout
    if command == ["demo"]:
        assert "--curriculum" in result.stdout and "--curriculum-minutes" in result.stdout
        assert "--tiny" in result.stdout and "smollm2-135m" in result.stdout
    if command == ["spool", "replay"]:
        for option in ("--db", "--spool"):
            assert option in result.stdout
    if command == ["rollback"]:
        # the help states the lease's times as literals (importing the lease would load the
        # store for every --help): they must be the lease's own
        help_text = " ".join(result.stdout.split())
        assert f"up to {OUTLASTS_TTL:.0f} s" in help_text, help_text
        assert f"runs out in {TTL.total_seconds():.0f})" in help_text, help_text
    if command == ["export"]:
        for option in ("--db", "--session", "--since", "--type", "--output"):
            assert option in result.stdout


def _seed(engine: Engine) -> None:
    day = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    rows = []
    for i, (session, at) in enumerate((("a", day), ("b", day + 86400), ("a", day + 172800))):
        rows.append(
            {
                "trajectories": [
                    {
                        "id": f"t{i}",
                        "session_key": session,
                        "interaction_type": f"kind-{session}",
                        "status": "finished",
                        "started_at": at,
                        "last_call_at": at,
                    }
                ],
                "calls": [
                    {
                        "id": f"c{i}",
                        "trajectory_id": f"t{i}",
                        "session_key": session,
                        "api": "chat.completions",
                        "upstream": "http://u",
                        "model": "m",
                        "policy_version": "v",
                        "stream": False,
                        "status": "ok",
                        "http_status": 200,
                        "error": None,
                        "request": {"messages": []},
                        "response": {},
                        "prompt_parent_id": None,
                        "prompt_prefix_len": 0,
                        "prompt_token_suffix": [i],
                        "prompt_len": 1,
                        "choices": [
                            {
                                "index": 0,
                                "token_ids": [9],
                                "logprobs": [-1.0],
                                "finish_reason": "stop",
                            }
                        ],
                        "finish_reason": "stop",
                        "prompt_tokens": 1,
                        "completion_tokens": 1,
                        "capture_complete": True,
                        "continuation_hash": None,
                        "started_at": at,
                        "latency_ms": 1.0,
                        "ttft_ms": None,
                    }
                ],
            }
        )
    with engine.begin() as conn:
        for batch in rows:
            recording.write_batch(conn, **batch)


def test_export_filters_and_format(db_url: str, engine: Engine, tmp_path) -> None:
    _seed(engine)
    everything = onthejob("export", "--db", db_url)
    assert everything.returncode == 0, everything.stderr
    lines = [orjson.loads(line) for line in everything.stdout.splitlines()]
    assert [t["id"] for t in lines] == ["t0", "t1", "t2"]
    call = lines[0]["calls"][0]
    for field in (
        "api",
        "model",
        "policy_version",
        "status",
        "request",
        "response",
        "prompt_token_ids",
        "completion_token_ids",
        "completion_logprobs",
        "latency_ms",
    ):
        assert field in call
    assert call["prompt_token_ids"] == [0] and call["completion_logprobs"] == [-1.0]
    assert "exported 3 trajectories" in everything.stderr

    by_session = onthejob("export", "--db", db_url, "--session", "a")
    assert [orjson.loads(x)["id"] for x in by_session.stdout.splitlines()] == ["t0", "t2"]
    assert lines[1]["interaction_type"] == "kind-b"
    by_type = onthejob("export", "--db", db_url, "--type", "kind-b")
    assert [orjson.loads(x)["id"] for x in by_type.stdout.splitlines()] == ["t1"]
    since = onthejob(
        "export",
        "--db",
        db_url,
        "--since",
        "2026-01-02T00:00:00Z",
        "-o",
        str(tmp_path / "out.jsonl"),
    )
    assert since.returncode == 0
    exported = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["id"] for x in exported] == ["t1", "t2"]


def test_export_rejects_a_bad_time(db_url: str, engine: Engine) -> None:
    result = onthejob("export", "--db", db_url, "--since", "yesterday")
    assert result.returncode != 0
    assert "ISO 8601" in result.stderr
    assert "Traceback" not in result.stderr


def test_db_upgrade_and_current(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert onthejob("db", "current", "--db", url).returncode == 1  # empty
    upgraded = onthejob("db", "upgrade", "--db", url)
    assert upgraded.returncode == 0, upgraded.stderr
    current = onthejob("db", "current", "--db", url)
    assert current.returncode == 0 and current.stdout.startswith(db.head_revision())


def _serve(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    dead = f"http://127.0.0.1:{free_port()}"
    return onthejob(
        "serve", "--db", url, "--upstream", dead, "--port", str(free_port()),
        "--spool", str(tmp_path / "spool.jsonl"), *args,
    )  # fmt: skip


def _assert_refused(result: subprocess.CompletedProcess[str], revision: str | None) -> None:
    assert result.returncode != 0
    assert f"schema is at {revision or 'nothing (never migrated)'}" in result.stderr
    assert "onthejob db upgrade" in result.stderr and "--migrate" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_schema_that_is_behind(db_url: str, tmp_path: Path) -> None:
    db.upgrade(db_url, "0003")
    _assert_refused(_serve(db_url, tmp_path), "0003")
    assert db.current_revision(db_url) == "0003"  # untouched


def test_only_db_upgrade_or_migrate_changes_the_schema_in_every_process(tmp_path: Path) -> None:
    # a newer learner must not migrate the database under older proxies: each process that
    # opens the store refuses a schema that is behind, unless told --migrate (one policy,
    # store/schema.py, for both databases: the proxy's refusal is drilled on PostgreSQL too)
    db_url = f"sqlite:///{tmp_path / 'behind.db'}"
    db.upgrade(db_url, "0003")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "t1", "prompt": "2+2?", "answer": "4"}\n')
    for command in (
        ("learn", "--model", str(tmp_path / "model")),
        ("regrade", "--failed"),
        ("tasks", "load", str(tasks)),
    ):
        _assert_refused(onthejob(*command, "--db", db_url), "0003")
    assert db.current_revision(db_url) == "0003"
    migrated = onthejob("regrade", "--failed", "--migrate", "--db", db_url)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("regraded 0")
    assert db.current_revision(db_url) == db.head_revision()


@pytest.mark.postgres
def test_serve_refuses_a_postgres_database_never_migrated(pg_url: str, tmp_path: Path) -> None:
    _assert_refused(_serve(pg_url, tmp_path), None)
    assert db.current_revision(pg_url) is None


def test_serve_refuses_a_new_sqlite_file_without_auto_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    env = {**os.environ, "ONTHEJOB_AUTO_MIGRATE": "false"}
    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--db", url, "--upstream", dead,
         "--port", str(free_port()), "--spool", str(tmp_path / "spool.jsonl")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode != 0 and "never migrated" in result.stderr


def test_serve_refuses_a_schema_newer_than_itself(db_url: str, tmp_path: Path) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        engine.dispose()
    result = _serve(db_url, tmp_path, "--migrate")
    assert result.returncode != 0 and "newer than this proxy" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_migrate_upgrades_the_schema(db_url: str, start_proxy) -> None:
    db.upgrade(db_url, "0003")
    proxy = start_proxy([f"http://127.0.0.1:{free_port()}"], db_url, args=["--migrate"])

    assert proxy.health()["status"] == "ok"
    assert db.current_revision(db_url) == db.head_revision()


def test_a_new_sqlite_file_gets_its_schema_at_start(tmp_path: Path, start_proxy) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    proxy = start_proxy([f"http://127.0.0.1:{free_port()}"], url)

    assert proxy.health()["status"] == "ok"
    assert db.current_revision(url) == db.head_revision()
