"""The learner's queries of the store (store/grade_queue.py and its kin), on both databases."""

from __future__ import annotations

import time

from sqlalchemy import Engine

from store import grade_queue, learner_state, policy_versions, recording


def _trajectory(tid: str, group: str | None, now: float) -> dict:
    return {
        "id": tid,
        "session_key": None,
        "task_key": "task",
        "group_key": group,
        "status": "finished",
        "started_at": now,
        "last_call_at": now,
    }


def test_fanout_groups_wait_until_every_member_is_graded(engine: Engine) -> None:
    now = time.time()
    members = [("a1", "g1"), ("a2", "g1"), ("a3", "g1"), ("b1", "g2"), ("b2", "g2"), ("c", None)]
    with engine.begin() as conn:
        recording.write_batch(
            conn, trajectories=[_trajectory(t, g, now) for t, g in members], calls=[]
        )
        for tid in ("a1", "a2", "b1", "b2", "c"):
            grade_queue.save_grade(conn, trajectory_id=tid, reward=0.5, detail={}, error=None)
        assert grade_queue.incomplete_groups(conn) == {"g1"}
        trainable = {r["trajectory_id"]: r["group_key"] for r in grade_queue.trainable_grades(conn)}
        assert trainable == {"a1": "g1", "a2": "g1", "b1": "g2", "b2": "g2", "c": None}
        # a grader error still counts as graded: the group is complete, the member untrainable
        grade_queue.save_grade(conn, trajectory_id="a3", reward=None, detail={}, error="boom")
        assert grade_queue.incomplete_groups(conn) == set()
        assert "a3" not in {r["trajectory_id"] for r in grade_queue.trainable_grades(conn)}


def test_versions_serve_one_at_a_time_and_state_round_trips(engine: Engine) -> None:
    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="v0", ordinal=0, parent=None, checkpoint_path="/a", status="serving"
        )
        policy_versions.add_version(
            conn, version="v1", ordinal=1, parent="v0", checkpoint_path="/b", status="serving"
        )
        assert policy_versions.serving_version(conn)["version"] == "v1"
        assert policy_versions.version(conn, version="v0")["status"] == "superseded"
        policy_versions.set_version_status(conn, version="v0", status="serving")
        assert policy_versions.serving_version(conn)["version"] == "v0"
        assert policy_versions.next_ordinal(conn) == 2
        learner_state.set_state(conn, "baselines", {"task": 0.25})
        learner_state.set_state(conn, "baselines", {"task": 0.5})
        assert learner_state.get_state(conn, "baselines") == {"task": 0.5}


def _call(call_id: str, trajectory_id: str, key_name: str | None, now: float) -> dict:
    return {
        "id": call_id,
        "trajectory_id": trajectory_id,
        "session_key": None,
        "api": "chat.completions",
        "status": "ok",
        "http_status": 200,
        "stream": False,
        "prompt_prefix_len": 0,
        "capture_complete": True,
        "started_at": now,
        "key_name": key_name,
    }


def test_learning_can_be_limited_to_the_traffic_of_chosen_keys(engine: Engine) -> None:
    now = time.time()
    calls = {  # trajectory: the key names of its calls
        "alpha": ["ci", "ci"],
        "beta": ["batch"],
        "mixed": ["ci", "stranger"],
        "anonymous": [None],
        "half": ["ci", None],
    }
    rows = [
        _call(f"{tid}-{i}", tid, name, now + i) for tid, names in calls.items()
        for i, name in enumerate(names)
    ]  # fmt: skip
    with engine.begin() as conn:
        trajectories = [_trajectory(t, None, now) for t in calls]
        recording.write_batch(conn, trajectories=trajectories, calls=rows)
        assert set(grade_queue.ungraded_finished(conn, limit=10)) == set(calls)
        chosen = ["ci", "batch"]
        assert set(grade_queue.ungraded_finished(conn, limit=10, keys=chosen)) == {"alpha", "beta"}
        assert grade_queue.count_ungraded_finished(conn, keys=chosen) == 2
        assert grade_queue.count_ungraded_finished(conn, keys=["ci"]) == 1
        for tid in calls:
            grade_queue.save_grade(conn, trajectory_id=tid, reward=1.0, detail={}, error=None)
        trainable = {r["trajectory_id"] for r in grade_queue.trainable_grades(conn, keys=["ci"])}
        assert trainable == {"alpha"}
        assert len(grade_queue.trainable_grades(conn)) == len(calls)
