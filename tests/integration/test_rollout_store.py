"""The runner's store and the learner's view of rollout runs, on PostgreSQL and SQLite."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import Engine

from learner.rollout.taskset import load_task_set, store_tasks
from store import grade_queue, recording, rollouts, turn_signals
from store.tasks import list_tasks
from store.turn_signals import Stored


def _trajectory(tid: str, session: str | None, now: float) -> dict:
    return {
        "id": tid,
        "session_key": session,
        "task_key": "msg:derived by the proxy",
        "group_key": None,
        "status": "open",
        "started_at": now,
        "last_call_at": now,
    }


def _start(conn, run_id: str, *, epoch: int = 0, task: str = "t1") -> None:
    rollouts.start_run(
        conn,
        id=run_id,
        rollout_id="r1",
        task_set="set",
        task_key=task,
        epoch=epoch,
        sample=0,
        session_key=rollouts.session_key_for(run_id),
        eval=False,
        command=["agent"],
    )


def test_learner_leaves_rollout_runs_to_the_runner_and_waits_for_whole_groups(
    engine: Engine,
) -> None:
    now = time.time()
    with engine.begin() as conn:
        for run_id in ("a", "b", "c"):
            _start(conn, run_id)
        rows = [_trajectory(f"t{r}", rollouts.session_key_for(r), now) for r in "abc"]
        rows.append(_trajectory("organic", None, now))
        recording.write_batch(conn, trajectories=rows, calls=[])
        for row in rows:  # e.g. finished by the proxy's idle timeout before the run ended
            recording.finish_trajectory(conn, trajectory_id=row["id"], ended_at=None)
        # the learner grades organic traffic only
        assert grade_queue.ungraded_finished(conn, limit=10) == ["organic"]
        assert grade_queue.count_ungraded_finished(conn) == 1

        group = rollouts.group_key_for("r1", 0, "t1", "v0")
        for run_id, reward in (("a", 1.0), ("b", 0.0)):
            ids = rollouts.trajectory_ids(conn, session_key=rollouts.session_key_for(run_id))
            assert ids == [f"t{run_id}"]
            rollouts.stamp_trajectories(conn, ids=ids, task_key="t1", group_key=group)
            rollouts.save_grades(
                conn, ids=ids, reward=reward, detail={}, error=None, trainable=True
            )
            rollouts.finish_run(conn, run_id=run_id, status="ok", reward=reward, group_key=group)
        # run c still runs: its graded siblings wait
        assert group in grade_queue.incomplete_groups(conn)
        rollouts.finish_run(conn, run_id="c", status="timeout", reward=0.0, group_key=group)
        rollouts.stamp_trajectories(conn, ids=["tc"], task_key="t1", group_key=group)
        rollouts.save_grades(conn, ids=["tc"], reward=0.0, detail={}, error=None, trainable=True)
        assert grade_queue.incomplete_groups(conn) == set()
        trainable = {r["trajectory_id"]: r for r in grade_queue.trainable_grades(conn)}
        assert set(trainable) == {"ta", "tb", "tc"}
        assert {r["task_key"] for r in trainable.values()} == {"t1"}
        assert {r["group_key"] for r in trainable.values()} == {group}
        # a late record of the run (same trajectory) keeps the runner's task and group
        late = {**_trajectory("ta", rollouts.session_key_for("a"), now + 1), "task_key": "msg:x"}
        recording.write_batch(conn, trajectories=[late], calls=[])
        (row,) = [r for r in grade_queue.trainable_grades(conn) if r["trajectory_id"] == "ta"]
        assert (row["task_key"], row["group_key"]) == ("t1", group)


def test_a_runs_signals_are_stored_each_with_the_trajectory_of_its_call(engine: Engine) -> None:
    now = time.time()
    calls = [
        {"id": f"{t}-call", "trajectory_id": t, "session_key": None, "api": "chat.completions",
         "status": "ok", "http_status": 200, "stream": False, "prompt_prefix_len": 0,
         "capture_complete": True, "started_at": now, "key_name": "alice"}
        for t in ("ta", "tb")
    ]  # fmt: skip
    signals = [
        Stored("ta-call", 1, -1.0, "corrected", "No, it's 21.", "alice"),
        Stored("tb-call", 1, 1.0, "approved", "Thanks!", "alice"),
        Stored("elsewhere", 1, -1.0, "corrected", "No.", "alice"),  # not the run's: dropped
    ]
    with engine.begin() as conn:
        _start(conn, "a")
        session = rollouts.session_key_for("a")
        rows = [_trajectory(t, session, now) for t in ("ta", "tb")]
        recording.write_batch(conn, trajectories=rows, calls=calls)
        rollouts.save_grades(
            conn, ids=["ta", "tb"], reward=0.5, detail={}, error=None, trainable=True,
            signals=signals,
        )  # fmt: skip
        stored = {t: turn_signals.signals_of(conn, t) for t in ("ta", "tb")}
        in_one_read = turn_signals.signals_by_trajectory(conn, ["ta", "tb", "none"])
    assert [(s["call_id"], s["rule"]) for s in stored["ta"]] == [("ta-call", "corrected")]
    assert [(s["call_id"], s["rule"]) for s in stored["tb"]] == [("tb-call", "approved")]
    assert in_one_read == {"ta": [signals[0]], "tb": [signals[1]]}


def test_eval_grades_are_never_trained_on_and_unfinished_runs_are_cancelled(
    engine: Engine,
) -> None:
    now = time.time()
    with engine.begin() as conn:
        _start(conn, "e")
        _start(conn, "left", task="t2")
        recording.write_batch(
            conn, trajectories=[_trajectory("te", rollouts.session_key_for("e"), now)], calls=[]
        )
        rollouts.stamp_trajectories(conn, ids=["te"], task_key="t1", group_key="g")
        rollouts.save_grades(conn, ids=["te"], reward=1.0, detail={}, error=None, trainable=False)
        rollouts.finish_run(conn, run_id="e", status="ok", reward=1.0)
        assert grade_queue.trainable_grades(conn) == []
        assert rollouts.cancel_unfinished(conn, rollout_id="r1") == 1
        runs = {r["id"]: r for r in rollouts.runs_of(conn, rollout_id="r1")}
    assert runs["left"]["status"] == "cancelled" and runs["left"]["ended_at"] is not None
    assert runs["e"]["status"] == "ok"


def test_group_keys_fit_and_separate_rounds_tasks_and_versions() -> None:
    keys = {
        rollouts.group_key_for("r" * 16, epoch, task, version)
        for epoch in (0, 1)
        for task in ("a", "x" * 500)
        for version in (None, "v" * 200)
    }
    assert len(keys) == 8 and all(len(k) <= 200 for k in keys)


def test_tasks_load_and_list(db_url: str, tmp_path: Path, engine: Engine) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "Say 4", "answer": "4"}\n'
        '{"id": "b", "prompt": "Fix it", "setup": "cp -r /fixture .", "check": "make test",'
        ' "grader": "reference", "metadata": {"kind": "repo"}}\n'
    )
    run = [sys.executable, "-m", "cli", "--log-level", "warning", "tasks"]
    loaded = subprocess.run(
        [*run, "load", str(path), "--db", db_url], capture_output=True, text=True, timeout=60
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded 2 tasks" in loaded.stdout
    listed = subprocess.run(
        [*run, "list", "--db", db_url], capture_output=True, text=True, timeout=60
    )
    assert listed.stdout.splitlines() == ["a\tanswer\tSay 4", "b\tgrader,setup,check\tFix it"]
    with engine.begin() as conn:
        rows = {r["key"]: r for r in list_tasks(conn)}
        assert rows["b"]["check"] == "make test" and rows["b"]["metadata"] == {"kind": "repo"}
        # loading again (changed) leaves one row per id
        path.write_text('{"id": "b", "prompt": "Fix it now", "check": "make check"}\n')
        store_tasks(conn, load_task_set(path))
        rows = {r["key"]: r for r in list_tasks(conn)}
    assert len(rows) == 2 and rows["b"]["check"] == "make check"

    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "check": ""}\n')
    bad = subprocess.run(
        [*run, "load", str(path), "--db", db_url], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0
    assert "line 2: field 'check'" in bad.stderr
