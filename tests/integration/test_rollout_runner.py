"""The runner with plain shell harnesses (no model: the proxy answers from a constant fake
upstream), on PostgreSQL and SQLite: how the prompt reaches the harness, setup failures,
failed runs, progress, and the store the runner reads being the proxy's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import select

from learner.proxy_process import ProxyServer
from learner.rollout import Progress, RolloutConfig, load_task_set, run_rollout
from store import db
from store.models import RolloutRun
from store.rollouts import runs_of

# one call to the model through the proxy, as any harness makes
CALL = (
    'curl -sf -o /dev/null "$OPENAI_BASE_URL/chat/completions" -H "content-type: '
    'application/json" -d \'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}\''
)
# prints stdin, the prompt argument and the environment's view of the run
HARNESS = [
    "sh",
    "-c",
    f'case "$ONTHEJOB_TASK" in fail) exit 1;; esac; {CALL}; cat; echo; echo "arg:$0"; '
    'echo "env:$ONTHEJOB_PROMPT"; echo "$OPENAI_BASE_URL"; pwd > where.txt',
    "{prompt}",
]
TASKS = [
    {"id": "ok", "prompt": "say 4", "answer": "env:say 4", "match": "contains"},
    {"id": "setup", "prompt": "x", "setup": "echo broken >&2; exit 3", "answer": "x"},
    {"id": "fail", "prompt": "x", "answer": "x"},
]


def config(db_url: str, tmp_path: Path, proxy: ProxyServer, **overrides) -> RolloutConfig:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    values = {
        "proxy_url": proxy.url + "/v1",
        "command": HARNESS,
        "tasks": load_task_set(path),
        "database_url": db_url,
        "group_size": 2,
        "concurrency": 3,
        "timeout": 30,
        "settle": 0.2,
        "record_wait": 10,  # a loaded host may write a call late; runs with calls settle at once
    }
    return RolloutConfig(**(values | overrides))


def test_prompt_setup_failures_and_progress(
    db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    seen = []
    summary = run_rollout(config(db_url, tmp_path, proxy), on_progress=seen.append)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            runs = runs_of(conn, rollout_id=summary.rollout_id)
    finally:
        engine.dispose()
    assert len(runs) == 6 and not summary.cancelled
    by_task = {r["task_key"]: r for r in runs}

    ok = by_task["ok"]
    lines = ok["stdout"].splitlines()
    assert lines[:3] == ["say 4", "arg:say 4", "env:say 4"]  # stdin, {prompt}, environment
    assert lines[3] == f"{proxy.url}/s/{ok['session_key']}/v1"
    assert ok["session_key"] == f"rollout-{ok['id']}"
    assert (ok["status"], ok["reward"], ok["exit_code"]) == ("ok", 1.0, 0)
    assert ok["workdir"]["where.txt"].strip().split("/")[-1].startswith("onthejob-run-")
    assert not Path(ok["workdir"]["where.txt"].strip()).exists()  # removed afterwards

    setup = by_task["setup"]
    assert (setup["status"], setup["reward"], setup["exit_code"]) == ("failed", None, None)
    assert "setup failed (exit 3): broken" in setup["error"]
    fail = by_task["fail"]
    assert (fail["status"], fail["reward"], fail["exit_code"]) == ("failed", 0.0, 1)

    assert [p.done for p in seen if p.last is not None] == [1, 2, 3, 4, 5, 6]
    assert seen[-1].failed == 4 and seen[-1].running == 0
    assert seen[-1].mean_reward == (1.0 * 2 + 0.0 * 2) / 4  # the setup failures have none
    assert max(p.running for p in seen) <= 3


def test_failure_reward_none_and_kept_workdirs(
    db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    summary = run_rollout(
        config(db_url, tmp_path, proxy, failure_reward=None, keep_workdirs=True, workdir_root=root)
    )
    fail = [r for r in summary.runs if r.task_key == "fail"]
    assert [(r.status, r.reward) for r in fail] == [("failed", None)] * 2
    assert "exited with 1" in (fail[0].error or "")
    kept = sorted(p.name for p in root.iterdir())
    assert len(kept) == 6 and all(name.startswith("onthejob-run-") for name in kept)


def onthejob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_refuses_bad_input_with_a_clear_message(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "a", "prompt": "p", "answer": "x"}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "p"}\n{"id": "b", "match": "fuzzy"}\n')
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    base = ["rollout", "--proxy", "http://127.0.0.1:9", "--db", db_url]
    cases = {
        (*base, "--tasks", str(bad), "--", "true"): "line 2: field 'match'",
        (*base, "--tasks", str(good)): "no harness command given",
        (*base, "--tasks", str(good), "--grader", "magic", "--", "true"): "unknown kind 'magic'",
        (*base, "--tasks", str(good), "--group-size", "0", "--", "true"): "group_size",
        ("rollout", "--proxy", "ftp://x", "--tasks", str(good), "--", "true"): "http(s)",
        (*base, "--tasks", str(good), "--failure-reward", "lots", "--", "true"): "'none'",
    }
    for args, message in cases.items():
        result = onthejob(*args)
        assert result.returncode != 0, args
        assert message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "db.sqlite").exists()  # refused before touching the database
    for command in ("eval-report", "tasks list"):  # a database without the schema
        result = onthejob(*command.split(), "--db", db_url)
        assert result.returncode == 1 and "onthejob db upgrade" in result.stderr
        assert "Traceback" not in result.stderr
    db.upgrade(db_url)
    empty = onthejob("eval-report", "--db", db_url)
    assert empty.returncode == 1 and "no eval results yet" in empty.stderr


def test_stop_event_cancels_from_the_library(
    db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    stop = threading.Event()

    def on_progress(progress: Progress) -> None:
        if progress.running == 2:  # both slots hold a sleeping harness
            stop.set()

    started = time.monotonic()
    summary = run_rollout(
        config(db_url, tmp_path, proxy, command=["sleep", "300"], concurrency=2, timeout=600),
        on_progress=on_progress,
        stop=stop,
    )
    assert summary.cancelled and time.monotonic() - started < 60
    assert [r.status for r in summary.runs] == ["cancelled", "cancelled"]
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            runs = runs_of(conn, rollout_id=summary.rollout_id)
    finally:
        engine.dispose()
    assert [r["status"] for r in runs] == ["cancelled", "cancelled"]  # the rest never started
    assert all(r["ended_at"] is not None and r["reward"] is None for r in runs)


def test_sigterm_stops_the_cli_like_ctrl_c(db_url: str, tmp_path: Path, proxy: ProxyServer) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "p", "answer": "x"}\n')
    db.upgrade(db_url)
    harness = f"echo $$ > {markers}/$$; exec sleep 300"
    rollout = subprocess.Popen(
        [sys.executable, "-m", "cli", "rollout", "--proxy", proxy.url,
         "--tasks", str(tasks), "--group-size", "3", "--concurrency", "2", "--db", db_url,
         "--no-progress", "--", "sh", "-c", harness],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(markers.iterdir())) < 2:  # both slots run a harness
            assert time.monotonic() < deadline and rollout.poll() is None
            time.sleep(0.05)
        rollout.terminate()
        _, err = rollout.communicate(timeout=60)
    finally:
        if rollout.poll() is None:
            rollout.kill()
    assert rollout.returncode == 130, err.decode()[-2000:]
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            statuses = conn.execute(select(RolloutRun.status)).scalars().all()
    finally:
        engine.dispose()
    assert statuses == ["cancelled", "cancelled"]
    assert all(_gone(int(marker.name)) for marker in markers.iterdir())


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_runner_reads_the_proxy_store_and_says_when_calls_never_arrive(
    db_url: str, tmp_path: Path, proxy: ProxyServer
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "p", "answer": "x"}\n')
    store = proxy.health()["store"]  # the proxy says which store it records to
    assert store["id"] and store["url"].endswith(db_url.rsplit("/", 1)[-1])
    # another database than the proxy's: refused before any run
    other = f"sqlite:///{tmp_path / 'other.db'}"
    db.upgrade(other)
    refused = onthejob(
        "rollout", "--proxy", proxy.url, "--tasks", str(tasks), "--db", other, "--", "true"
    )
    assert refused.returncode != 0 and "records to" in refused.stderr, refused.stderr
    assert "would not find any run's calls" in refused.stderr
    # no --db: the proxy's own store; a harness that exits 0 without calling the model is a
    # failed run that says why, and the command fails
    env_free = {k: v for k, v in os.environ.items() if k != "ONTHEJOB_DATABASE_URL"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    silent = subprocess.run(
        [sys.executable, "-m", "cli", "rollout", "--proxy", proxy.url, "--tasks",
         str(tasks), "--group-size", "2", "--no-progress", "--", "true"],
        capture_output=True, text=True, timeout=120, env=env_free, cwd=elsewhere,
    )  # fmt: skip
    assert silent.returncode == 1, silent.stderr
    assert "2 runs failed: the harness exited 0, but none of its calls" in silent.stderr
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            runs = conn.execute(select(RolloutRun.status, RolloutRun.error)).all()
    finally:
        engine.dispose()
    assert [status for status, _ in runs] == ["failed", "failed"]
    assert all("OPENAI_BASE_URL" in (error or "") for _, error in runs)
    assert not (elsewhere / "onthejob.db").exists()  # not the working directory's default
