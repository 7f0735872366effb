"""The admin API of the proxy app in-process (tests/support/inprocess.py), against
PostgreSQL and SQLite.

Rows are written with the store's own batch writer (store/recording.py, what the recorder
uses) and the store's query modules; the API is read through the app's own HTTP stack.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import Engine, select

from learner.config import LearnerConfig
from learner.control import follow
from learner.loop import Learner
from learner.swap.requests import SwapRequestWorker
from learner.vllm_server import free_port
from proxy.settings import Settings
from store import grade_queue, learner_state, policy_versions, recording
from store.export import iter_trajectories
from store.feedback import add_feedback
from store.models import Grade, SwapRequest
from store.trajectory_loading import load_trajectories
from tests.support.admin import AUTH, TOKEN, N, chat_call, kind_of, seed
from tests.support.inprocess import in_process_client

PAGE = 5


@pytest.fixture
def nobody() -> str:
    """The proxy's upstream: these routes never need one, so nobody answers there."""
    return f"http://127.0.0.1:{free_port()}"


def app_settings(db_url: str, tmp_path: Path, upstream: str, **extra: Any) -> dict[str, Any]:
    return {
        "upstreams": [upstream],
        "database_url": db_url,
        "spool_path": tmp_path / "spool.jsonl",
        **extra,
    }


@pytest.fixture
def api(db_url: str, engine: Engine, tmp_path: Path, nobody: str) -> Iterator[httpx.Client]:
    """The app with an admin token, its URLs from /admin/api, the token sent with each."""
    settings = app_settings(db_url, tmp_path, nobody, admin_token=TOKEN)
    with in_process_client("/admin/api", headers=AUTH, **settings) as client:
        yield client


def without_token(api: httpx.Client, method: str, path: str) -> httpx.Response:
    request = api.build_request(method, path)
    del request.headers["Authorization"]
    return api.send(request)


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def test_every_route_needs_the_token(api: httpx.Client) -> None:
    schema = without_token(api, "GET", "/openapi.json").json()
    assert "/api/trajectories" in schema["paths"]
    for path in (
        "/trajectories",
        "/stats",
        "/learner",
        "/versions",
        "/tasks",
        "/export",
        "/compat",
        "/curricula",
        "/types",
        "/learning-curves",
        "/self-judge",
        "/guard",
    ):
        missing = without_token(api, "GET", path)
        assert "token" in error_of(missing, 401)
        wrong = api.get(path, headers={"Authorization": "Bearer x"})
        assert wrong.json()["error"]["type"] == "authentication_error"
        assert wrong.status_code == 401
        assert api.get(path).status_code == 200
    posted = without_token(api, "POST", "/learner/pause")
    assert posted.status_code == 401


def test_the_admin_api_is_off_without_a_token(
    db_url: str, engine: Engine, tmp_path: Path, nobody: str
) -> None:
    with in_process_client(**app_settings(db_url, tmp_path, nobody)) as proxy:
        response = proxy.get("/admin/api/trajectories", headers=AUTH)
    assert "ONTHEJOB_ADMIN_TOKEN" in error_of(response, 403)


def test_pages_walk_every_trajectory_once_newest_first(api: httpx.Client, engine: Engine) -> None:
    made = seed(engine)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": PAGE}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/trajectories", params=params).json()
        pages += 1
        assert len(page["items"]) <= PAGE
        seen += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == -(-N // PAGE)
    assert seen == [m["id"] for m in made]
    first = api.get("/trajectories", params={"limit": 1}).json()["items"][0]
    assert first["calls"] == 2 and first["status"] == "open"
    assert first["completion_tokens"] == 5 and first["policy_versions"] == ["v0"]
    # a trajectory arriving while paging does not shift the pages after the cursor
    cursor = api.get("/trajectories", params={"limit": PAGE}).json()["next_cursor"]
    seed(engine, 1, now=time.time() + 10_000)
    after = api.get("/trajectories", params={"limit": PAGE, "cursor": cursor}).json()
    assert [t["id"] for t in after["items"]] == seen[PAGE : 2 * PAGE]


def ids(api: httpx.Client, **params: Any) -> set[str]:
    response = api.get("/trajectories", params={"limit": 500, **params})
    assert response.status_code == 200, response.text
    return {t["id"] for t in response.json()["items"]}


def test_filters(api: httpx.Client, engine: Engine) -> None:
    made = seed(engine)
    by_index = {int(m["id"][4:]): m for m in made}
    assert ids(api, session="s7") == {"traj007"}
    assert ids(api, task_key="task-1") == {f"traj{i:03d}" for i in range(N) if i % 3 == 1}
    assert ids(api, status="open") == {f"traj{N - 1:03d}"}
    assert ids(api, type="kind-a") == {f"traj{i:03d}" for i in range(N) if kind_of(i) == "kind-a"}
    assert ids(api, type="kind-a", policy_version="v1") == {
        f"traj{i:03d}" for i in range(N) if kind_of(i) == "kind-a" and i % 2
    }
    assert ids(api, policy_version="v1") == {f"traj{i:03d}" for i in range(N) if i % 2}
    graded = {f"traj{i:03d}" for i in range(0, N - 1, 2)}
    assert ids(api, graded="true") == graded
    assert ids(api, min_reward=0.5) == {f"traj{i:03d}" for i in range(0, N - 1, 2) if i / N >= 0.5}
    assert ids(api, min_reward=0.1, max_reward=0.2) == {
        f"traj{i:03d}" for i in range(0, N - 1, 2) if 0.1 <= i / N <= 0.2
    }
    since = datetime.fromtimestamp(by_index[20]["started"], UTC)
    until = datetime.fromtimestamp(by_index[22]["started"], UTC)
    assert ids(api, since=since.isoformat(), until=until.isoformat()) == {"traj020", "traj021"}
    # text search in the recorded requests, case-insensitive, % and _ taken literally
    assert ids(api, q="QUESTION NUMBER 13") == {"traj013"}
    assert ids(api, q="and then") == {m["id"] for m in made}
    assert ids(api, q="100%") == set()
    assert ids(api, q="_") == set()
    assert ids(api, session="s7", status="open") == set()


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"status": "done"}, "status"),
        ({"min_reward": "nan"}, "min_reward"),
        ({"min_reward": 1, "max_reward": 0}, None),
        ({"since": "yesterday"}, "since"),
        ({"session": "a\x00b"}, "session"),
        ({"q": ""}, "q"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_bad_list_input_is_a_clear_400(
    api: httpx.Client, params: dict[str, Any], param: str | None
) -> None:
    response = api.get("/trajectories", params=params)
    message = error_of(response, 400)
    assert message
    if param is not None:
        assert response.json()["error"]["param"] == param


def test_one_trajectory_with_conversation_and_tokens(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    with engine.begin() as conn:
        add_feedback(conn, reward=1.0, trajectory_id="traj002", session_key=None, comment="nice")
    detail = api.get("/trajectories/traj002", params={"token_text": "false"}).json()
    assert [c["id"] for c in detail["calls"]] == ["c002a", "c002b"]
    assert detail["grade"]["reward"] == pytest.approx(2 / N)
    assert detail["feedback"][0]["comment"] == "nice"
    assert [(m["role"], m["text"]) for m in detail["messages"]] == [
        ("user", "question number 2"),
        ("assistant", "answer 2"),
        ("user", "and then?"),
        ("assistant", "the end"),
    ]
    assert detail["messages"][1]["call_id"] == "c002a"
    [sequence] = detail["tokens"]
    # the second call extends the first: one sequence, loss only on sampled tokens
    assert sequence["token_ids"] == [1, 2, 3, 12, 20, 21, 22, 4, 5, 30, 31]
    assert sequence["loss_mask"] == [False] * 4 + [True] * 3 + [False] * 2 + [True] * 2
    assert sequence["logprobs"] == [0.0] * 4 + [-0.5] * 3 + [0.0] * 2 + [-0.5] * 2
    # the failed second call of traj004 is no training data: only the first call's tokens
    broken = api.get("/trajectories/traj004", params={"token_text": "false"}).json()
    assert [s["trained_tokens"] for s in broken["tokens"]] == [3]
    assert broken["messages"][-1]["role"] == "error"
    # the upstream is down: no token texts, still an answer
    with_text = api.get("/trajectories/traj002").json()
    assert with_text["tokens"][0]["token_text"] is None
    assert "no trajectory" in error_of(api.get("/trajectories/nope"), 404)
    assert api.get("/trajectories/" + "x" * 65).status_code == 400


def test_token_texts_from_a_local_tokenizer_while_vllm_is_down(
    db_url: str, engine: Engine, tmp_path: Path, nobody: str
) -> None:
    """`serve --tokenizer DIR`: the token view reads the model's tokenizer.json, so a store
    can be looked at with no vLLM running (after a demo); a wrong path stops the start."""
    from pydantic import ValidationError
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    seed(engine)
    words = {f"w{i}": i for i in range(64)}
    (tmp_path / "model").mkdir()
    Tokenizer(WordLevel(words, unk_token="w0")).save(str(tmp_path / "model" / "tokenizer.json"))
    settings = app_settings(db_url, tmp_path, nobody, admin_token=TOKEN)
    with in_process_client(
        "/admin/api", headers=AUTH, tokenizer=tmp_path / "model", **settings
    ) as client:
        [sequence] = client.get("/trajectories/traj002").json()["tokens"]
    assert sequence["token_text"] == [f"w{i}" for i in sequence["token_ids"]]
    with pytest.raises(ValidationError, match=r"no tokenizer\.json at"):
        Settings(tokenizer=tmp_path / "nothing", **settings)


def test_next_turn_signals_judge_the_turn_before(api: httpx.Client, engine: Engine) -> None:
    """The user asks again, word for word: the reply before is judged by it."""
    asked = [{"role": "user", "content": "What is 6 x 7?"}]
    again = [
        *asked,
        {"role": "assistant", "content": "43"},
        {"role": "user", "content": "what is 6 x 7?"},
    ]
    now = time.time()
    calls = [
        chat_call("r1", "retry", started=now, prompt=[1, 2], completion=[3],
                  messages=asked, reply="43", version="v0"),
        chat_call("r2", "retry", started=now + 1, prompt=[1, 2, 3, 4], completion=[5],
                  messages=again, reply="42", version="v0", parent="r1", prefix_len=3),
    ]  # fmt: skip
    trajectory = {"id": "retry", "session_key": None, "task_key": "t", "group_key": None,
                  "interaction_type": None, "status": "finished", "started_at": now,
                  "last_call_at": now + 1, "ended_at": None}  # fmt: skip
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=[trajectory], calls=calls)
    detail = api.get("/trajectories/retry", params={"token_text": "false"}).json()
    [signal] = detail["signals"]
    assert signal == {
        "call_id": "r1",
        "turn": 1,
        "value": -1.0,
        "rule": "retried",
        "evidence": "what is 6 x 7?",
    }
    assert (detail["messages"][1]["call_id"], detail["messages"][1]["text"]) == ("r1", "43")


def test_feedback_posts_and_corrects_rewards(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    response = api.post(
        "/feedback", json={"trajectory_id": "traj002", "reward": 0.9, "comment": "good"}
    )
    assert response.status_code == 201, response.text
    assert response.json()["grades_corrected"] == ["traj002"]
    with engine.begin() as conn:
        before = conn.execute(
            select(Grade.reward).where(Grade.trajectory_id == "traj004")
        ).scalar_one()
        grade_queue.mark_trained(conn, trajectory_ids=["traj004"], step=1)
    detail = api.get("/trajectories/traj002", params={"token_text": "false"}).json()
    assert detail["reward"] == 0.9 and detail["grade"]["reward"] == 0.9
    assert detail["grade"]["detail"]["operator"]["was"] == pytest.approx(2 / N)
    # trained on already: the step stays as it was, the trajectory shows the new reward
    trained = api.post("/feedback", json={"trajectory_id": "traj004", "reward": -1})
    assert trained.json()["grades_corrected"] == []
    after = api.get("/trajectories/traj004", params={"token_text": "false"}).json()
    assert after["reward"] == -1 and after["grade"]["reward"] == before
    by_session = api.post("/feedback", json={"session": "s3", "reward": 0.25})
    assert by_session.status_code == 201 and by_session.json()["trajectories"] == ["traj003"]
    assert api.get("/feedback", params={"session": "s3"}).json()["items"][0]["reward"] == 0.25
    assert "trajectory" in error_of(
        api.post("/feedback", json={"trajectory_id": "no", "reward": 1}), 404
    )
    for bad in (
        {"reward": 1},
        {"trajectory_id": "traj002", "session": "s2", "reward": 1},
        {"trajectory_id": "traj002", "reward": "high"},
        {"trajectory_id": "traj002", "reward": 1e300},
        {"trajectory_id": "traj002", "reward": 1, "extra": True},
    ):
        assert error_of(api.post("/feedback", json=bad), 400), bad
    assert (
        api.post(
            "/feedback", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 400
    )


def test_tasks_load_list_delete(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    lines = [
        {"id": "task-0", "prompt": "p0", "answer": "42", "match": "numeric"},
        {"id": "what is 1/2?", "answer": "0.5"},
    ]
    loaded = api.post("/tasks", json={"jsonl": "\n".join(json.dumps(t) for t in lines)})
    assert loaded.status_code == 201, loaded.text
    assert api.post("/tasks", json={"tasks": [{"id": "t3", "answer": "x"}]}).status_code == 201
    rollout_task = {"id": "t4", "prompt": "p", "setup": "mkdir x", "check": "test -d x"}
    assert api.post("/tasks", json={"tasks": [rollout_task]}).status_code == 201
    stored = api.get("/tasks/t4").json()
    assert (stored["setup"], stored["check"]) == ("mkdir x", "test -d x")
    assert api.delete("/tasks/t4").status_code == 204
    listed = api.get("/tasks", params={"limit": 2}).json()
    assert [t["key"] for t in listed["items"]] == ["t3", "task-0"]
    assert listed["items"][1]["trajectories"] == len(range(0, N, 3))
    rest = api.get("/tasks", params={"limit": 2, "after": listed["next_after"]}).json()
    assert [t["key"] for t in rest["items"]] == ["what is 1/2?"] and rest["next_after"] is None
    assert api.get("/tasks/" + quote("what is 1/2?", safe="")).json()["answer"] == "0.5"
    bad = api.post(
        "/tasks", json={"tasks": [{"id": "ok"}, {"id": "n", "answer": "x", "match": "numeric"}]}
    )
    assert "tasks[1]" in error_of(bad, 400)
    assert "line 2" in error_of(
        api.post("/tasks", json={"jsonl": '{"id": "a"}\n{"anwser": 1}'}), 400
    )
    assert error_of(api.post("/tasks", json={"tasks": []}), 400)
    assert api.get("/tasks/ok").status_code == 404  # nothing of a bad load was written
    assert api.delete("/tasks/" + quote("what is 1/2?", safe="")).status_code == 204
    assert "no task" in error_of(api.delete("/tasks/" + quote("what is 1/2?", safe="")), 404)
    with engine.connect() as conn:
        assert learner_state.get_state(conn, "tasks_revision") == {"revision": 5}


def test_versions_listed_with_rewards_and_guarded(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="v0", ordinal=0, parent=None, checkpoint_path=None, status="superseded"
        )
        policy_versions.add_version(
            conn,
            version="v1",
            ordinal=1,
            parent="v0",
            checkpoint_path="/nonexistent",
            status="serving",
            swap_seconds=0.05,
            metrics={"loss": 0.1},
        )
    listed = api.get("/versions").json()
    assert listed["serving"] == "v1"
    v1, v0 = listed["items"]
    assert v1["metrics"] == {"loss": 0.1} and v1["swap_seconds"] == 0.05
    assert v1["calls"] == 2 * len(range(1, N, 2))
    graded_v0 = [i / N for i in range(0, N - 1, 2)]
    assert v0["trajectories_graded"] == len(graded_v0)
    assert v0["mean_reward"] == pytest.approx(sum(graded_v0) / len(graded_v0))
    assert v1["trajectories_graded"] == 0 and v1["mean_reward"] is None
    assert "no policy version" in error_of(api.post("/versions/nope/rollback"), 404)
    assert "already serving" in error_of(api.post("/versions/v1/promote"), 409)
    assert "no checkpoint" in error_of(api.post("/versions/v0/rollback"), 409)
    # pinned: retention keeps its checkpoint; a deleted one cannot be pinned or served again
    assert api.put("/versions/v1/pin").json() == {"ok": True, "version": "v1", "pinned": True}
    assert api.get("/versions").json()["items"][0]["pinned"] is True
    assert api.delete("/versions/v1/pin").json()["pinned"] is False
    assert "no policy version" in error_of(api.put("/versions/nope/pin"), 404)
    with engine.begin() as conn:
        policy_versions.mark_checkpoints_deleted(conn, versions=["v1"])
    assert api.get("/versions").json()["items"][0]["has_checkpoint"] is False
    assert "deleted already" in error_of(api.put("/versions/v1/pin"), 409)


def _v1_serving_after_v0(engine: Engine) -> None:
    """Two recorded versions without probes: v1 serves, v0 superseded."""
    with engine.begin() as conn:
        for ordinal, name in enumerate(("v0", "v1")):
            policy_versions.add_version(
                conn,
                version=name,
                ordinal=ordinal,
                parent=None,
                checkpoint_path=f"/checkpoints/{name}",
                status="serving" if name == "v1" else "superseded",
            )


def test_a_rollback_is_the_learners_to_carry_out(
    api: httpx.Client, engine: Engine, nobody: str
) -> None:
    """The admin API records the request; a learner's worker claims it and answers through
    the store. With no learner running nobody claims it: 503, and it is never carried out."""
    _v1_serving_after_v0(engine)
    message = error_of(api.post("/versions/v0/rollback"), 503)
    assert "no learner is running" in message and "onthejob rollback v0" in message
    with engine.connect() as conn:
        (abandoned,) = conn.execute(select(SwapRequest.status)).scalars().all()
    assert abandoned == "abandoned"

    worker = SwapRequestWorker(engine, [nobody]).start()
    try:
        # v0 was recorded without a probe: the learner's swap code refuses it, and says how
        message = error_of(api.post("/versions/v0/rollback"), 409)
    finally:
        worker.stop()
    assert "no recorded probe" in message and "onthejob rollback v0" in message
    with engine.connect() as conn:
        statuses = conn.execute(select(SwapRequest.status).order_by(SwapRequest.id)).scalars()
        assert statuses.all() == ["abandoned", "failed"]
        assert policy_versions.serving_version(conn)["version"] == "v1"


class HeldControl:
    """The time slice's control (learner/time_slice.py) held, as a sliced step holds it from
    its pause to its resume; says when a swap has come to wait on it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.waiting = threading.Event()

    def __enter__(self) -> None:
        self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_rollback_waits_for_the_sliced_step_to_resume_the_replicas(
    api: httpx.Client, engine: Engine, nobody: str
) -> None:
    """A swap during a sliced step would wait out its drain on requests the slice froze, and
    its resume would end the slice early: the worker takes the slice's control first."""
    _v1_serving_after_v0(engine)
    control = HeldControl()
    worker = SwapRequestWorker(engine, [nobody], replica_control=control).start()
    answers: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answers.append(api.post("/versions/v0/rollback")))
    try:
        asking.start()
        assert control.waiting.wait(30), "the swap never came to the slice's control"
        with engine.connect() as conn:
            (status,) = conn.execute(select(SwapRequest.status)).scalars().all()
        assert status == "running" and not answers  # claimed, waiting, not carried out
        control.lock.release()  # the step's compute ends, the replicas are resumed
        asking.join(60)
    finally:
        worker.stop()
    assert "no recorded probe" in error_of(answers[0], 409)


def test_learner_pause_and_knobs_reach_the_learner(
    api: httpx.Client, engine: Engine, db_url: str, tmp_path: Any
) -> None:
    assert api.get("/learner").json()["state"] == "never_seen"
    assert api.post("/learner/pause").json()["pause_requested"] is True
    changed = api.patch(
        "/learner/knobs", json={"learning_rate": 3e-4, "max_staleness": 1, "fanout": 4}
    ).json()
    assert changed["control"]["learning_rate"] == 3e-4 and changed["fanout"] == 4
    for bad in ({"learning_rate": 0}, {"batch_trajectories": 0}, {"fanout": 100}, {"x": 1}):
        assert error_of(api.patch("/learner/knobs", json=bad), 400), bad
    learner = Learner(
        LearnerConfig(
            database_url=db_url,
            model=str(tmp_path),
            checkpoints=str(tmp_path / "ckpt"),
            poll_interval=0.01,
        )
    )
    try:
        assert follow(learner.state) is True  # paused
        assert learner.state.config.learning_rate == 3e-4
        assert learner.state.trainer_config.learning_rate == 3e-4
        assert learner.state.grouping.max_staleness == 1
        status = api.get("/learner").json()
        assert status["state"] == "paused" and status["heartbeat"]["learning_rate"] == 3e-4
        api.post("/learner/resume")
        api.patch("/learner/knobs", json={"batch_trajectories": 2})
        assert follow(learner.state) is False
        assert learner.state.config.batch_trajectories == 2
        assert api.get("/learner").json()["state"] == "running"
        # a knob set to null goes back to what the learner was started with
        api.patch("/learner/knobs", json={"learning_rate": None})
        follow(learner.state)
        assert (
            learner.state.config.learning_rate
            == LearnerConfig.model_fields["learning_rate"].default
        )
        assert (
            learner.state.trainer_config.learning_rate
            == LearnerConfig.model_fields["learning_rate"].default
        )
        assert learner.state.config.batch_trajectories == 2
        # tasks loaded through the API reach the learner's grader table
        api.post("/tasks", json={"tasks": [{"id": "k", "answer": "7"}]})
        follow(learner.state)
        assert learner.state.tasks["k"].answer == "7"
    finally:
        learner.state.engine.dispose()


def test_the_batch_bound_is_a_live_knob_and_the_last_batch_is_reported(
    api: httpx.Client, db_url: str, tmp_path: Any
) -> None:
    assert error_of(api.patch("/learner/knobs", json={"max_batch_trajectories": -1}), 400)
    api.patch("/learner/knobs", json={"max_batch_trajectories": 8})
    learner = Learner(
        LearnerConfig(database_url=db_url, model=str(tmp_path), checkpoints=str(tmp_path / "c"))
    )
    try:
        assert learner.state.config.max_batch_trajectories == 32
        learner.state.last_batch = {"trained": False, "considered_trajectories": 3, "dropped": []}
        follow(learner.state)
        assert learner.state.config.max_batch_trajectories == 8
        status = api.get("/learner").json()
        assert status["control"]["max_batch_trajectories"] == 8
        assert status["heartbeat"]["max_batch_trajectories"] == 8
        assert status["heartbeat"]["last_batch"]["considered_trajectories"] == 3
        api.patch("/learner/knobs", json={"max_batch_trajectories": None})
        follow(learner.state)
        assert learner.state.config.max_batch_trajectories == 32
        # the wait for the serving version's own samples, likewise
        assert error_of(api.patch("/learner/knobs", json={"fresh_wait": -1}), 400)
        api.patch("/learner/knobs", json={"fresh_wait": 90})
        follow(learner.state)
        assert learner.state.config.fresh_wait == learner.state.shared.fresh.limit_seconds == 90
        assert api.get("/learner").json()["heartbeat"]["fresh_wait"] == 90
        api.patch("/learner/knobs", json={"fresh_wait": None})
        follow(learner.state)
        assert learner.state.shared.fresh.limit_seconds == 0
    finally:
        learner.state.engine.dispose()


def test_stats(api: httpx.Client, engine: Engine) -> None:
    now = time.time()
    seed(engine, now=now)
    until = datetime.fromtimestamp(now, UTC) + timedelta(minutes=1)
    since = until - timedelta(hours=6)
    body = api.get("/stats", params={"since": since.isoformat(), "until": until.isoformat()}).json()
    traffic = body["traffic"]
    in_window = [i for i in range(N) if now - (N - i) * 600 >= since.timestamp()]
    assert traffic["calls"] == 2 * len(in_window)
    assert traffic["errors"] == (1 if 4 in in_window else 0)
    assert traffic["tokens_out"] == 5 * len(in_window)
    assert traffic["calls_per_minute"] == pytest.approx(traffic["calls"] / 360)
    latencies = sorted([100.0 + i for i in in_window] + [1000.0 + i for i in in_window])
    assert traffic["latency_ms"]["p50"] == latencies[round(0.5 * (len(latencies) - 1))]
    assert traffic["latency_ms"]["p99"] == latencies[-1]
    assert sum(b["calls"] for b in traffic["series"]) == traffic["calls"]
    assert all(b["t"].endswith(":00:00Z") for b in traffic["series"])
    rewards = body["rewards"]
    by_version = {r["version"]: r for r in rewards["by_version"]}
    assert set(by_version) == {"v0"}
    assert by_version["v0"]["trajectories"] == len(range(0, N - 1, 2))
    by_task = {r["task_key"]: r for r in rewards["by_task"]}
    assert by_task["task-0"]["mean_reward"] == pytest.approx(
        sum(i / N for i in range(0, N - 1, 6)) / len(range(0, N - 1, 6))
    )
    day = api.get("/stats", params={"bucket": "day"}).json()
    assert sum(b["calls"] for b in day["traffic"]["series"]) == 2 * N
    assert all(b["t"].endswith("T00:00:00Z") for b in day["traffic"]["series"])
    assert error_of(
        api.get("/stats", params={"since": until.isoformat(), "until": since.isoformat()}), 400
    )
    assert "too long" in error_of(api.get("/stats", params={"since": "2000-01-01"}), 400)


CLAUDE = "claude-cli/2.1.332 (external, sdk-cli)"
CODEX = "codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown (codex_exec; 0.171.0)"


def _compat_call(
    call_id: str, *, api: str, user_agent: str | None, compat: Any, started: float
) -> dict[str, Any]:
    row = chat_call(
        call_id,
        "tc",
        started=started,
        prompt=[1],
        completion=[2],
        messages=[],
        reply="",
        version="v",
    )
    return {**row, "trajectory_id": None, "api": api, "user_agent": user_agent, "compat": compat}


def test_compat_per_harness(api: httpx.Client, engine: Engine) -> None:
    now = time.time()
    claude = {
        "honoured": ["thinking", "output_config.effort"],
        "ignored": ["metadata", "context_management.clear_thinking_20251015"],
        "left_out": ["web_search_20250305"],
    }
    refused = {
        "refused": ["messages.content.type"],
        "detail": {"refused": {"param": "messages.0.content.0.type", "message": "no images"}},
    }
    codex = {"flattened": ["multi_agent_v1"], "left_out": ["web_search"], "unknown": ["x_new"]}
    rows = [
        _compat_call("k1", api="messages", user_agent=CLAUDE, compat=claude, started=now - 60),
        _compat_call("k2", api="messages", user_agent=CLAUDE, compat=claude, started=now - 50),
        _compat_call("k3", api="messages", user_agent=CLAUDE, compat=refused, started=now - 40),
        _compat_call("k4", api="responses", user_agent=CODEX, compat=codex, started=now - 30),
        _compat_call("k5", api="chat.completions", user_agent=None, compat=None, started=now - 20),
        # outside the default window of 24 hours
        _compat_call("k6", api="responses", user_agent=CODEX, compat=codex, started=now - 90000),
    ]
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=[], calls=rows)
    body = api.get("/compat").json()
    harnesses = {h["user_agent"]: h for h in body["harnesses"]}
    assert [h["user_agent"] for h in body["harnesses"]] == [CLAUDE, CODEX, None]
    assert (harnesses[CLAUDE]["calls"], harnesses[CLAUDE]["apis"]) == (3, {"messages": 3})
    assert harnesses[CLAUDE]["honoured"] == [
        {"feature": "output_config.effort", "calls": 2},
        {"feature": "thinking", "calls": 2},
    ]
    assert harnesses[CLAUDE]["left_out"] == [{"feature": "web_search_20250305", "calls": 2}]
    assert harnesses[CLAUDE]["refused"] == [{"feature": "messages.content.type", "calls": 1}]
    assert harnesses[CLAUDE]["refusals"] == [refused["detail"]["refused"]]
    assert harnesses[CODEX]["calls"] == 1
    assert harnesses[CODEX]["flattened"] == [{"feature": "multi_agent_v1", "calls": 1}]
    assert harnesses[CODEX]["unknown"] == [{"feature": "x_new", "calls": 1}]
    assert harnesses[None]["apis"] == {"chat.completions": 1}
    assert harnesses[None]["ignored"] == []
    week = api.get(
        "/compat", params={"since": datetime.fromtimestamp(now - 7 * 86400, UTC).isoformat()}
    )
    assert {h["user_agent"]: h["calls"] for h in week.json()["harnesses"]}[CODEX] == 2
    backwards = {"since": datetime.now(UTC).isoformat(), "until": "2020-01-01T00:00:00Z"}
    assert "since" in error_of(api.get("/compat", params=backwards), 400)


def test_types_per_version(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    body = api.get("/types", params={"success_at": 0.5}).json()
    assert body["success_at"] == 0.5
    types = {t["interaction_type"]: t for t in body["types"]}
    assert set(types) == {"kind-a", "auto:agent:0123456789ab"}
    rewards = {i: i / N for i in range(0, N - 1, 2)}  # graded: even, not the last
    for kind, figures in types.items():
        mine = [i for i in range(N) if kind_of(i) == kind]
        assert figures["trajectories"] == len(mine)
        for version in figures["by_version"]:
            of_version = [i for i in mine if f"v{i % 2}" == version["policy_version"]]
            graded = [rewards[i] for i in of_version if i in rewards]
            assert version["trajectories"] == len(of_version)
            assert version["graded"] == len(graded)
            if graded:
                assert version["mean_reward"] == pytest.approx(sum(graded) / len(graded))
                assert version["success_rate"] == pytest.approx(
                    sum(r >= 0.5 for r in graded) / len(graded)
                )
            else:
                assert version["mean_reward"] is None and version["success_rate"] is None
        graded = [rewards[i] for i in mine if i in rewards]
        assert figures["mean_reward"] == pytest.approx(sum(graded) / len(graded))
        assert figures["successes"] == sum(r >= 0.5 for r in graded)
    assert {v["policy_version"] for v in types["kind-a"]["by_version"]} == {"v0", "v1"}
    only = api.get("/types", params={"type": "kind-a"}).json()["types"]
    assert [t["interaction_type"] for t in only] == ["kind-a"]
    assert only[0]["success_rate"] == 0.0  # success_at defaults to 1.0: no reward reaches it
    assert "success_at" in error_of(api.get("/types", params={"success_at": "x"}), 400)
    assert error_of(api.get("/types", params={"nope": 1}), 400)
    backwards = {"since": datetime.now(UTC).isoformat(), "until": "2020-01-01T00:00:00Z"}
    assert "since" in error_of(api.get("/types", params=backwards), 400)


def test_learning_curves_fit_the_run_with_a_band(api: httpx.Client, engine: Engine) -> None:
    assert api.get("/learning-curves").json()["types"] == []  # nothing graded yet
    seed(engine)  # graded: even i but the last, 10 minutes apart, reward i/N
    rewards = {i: i / N for i in range(0, N - 1, 2)}
    body = api.get("/learning-curves", params={"success_at": 0.5}).json()
    # the graded ones span 200 minutes: 10-minute buckets are the smallest round ones that
    # make at most 30 of them
    assert body["bucket_seconds"] == 600
    curves = {c["interaction_type"]: c for c in body["types"]}
    assert set(curves) == {"kind-a", "auto:agent:0123456789ab"}
    for kind, curve in curves.items():
        mine = [i for i in sorted(rewards) if kind_of(i) == kind]
        assert curve["trajectories"] == len(mine)
        assert [p["mean_reward"] for p in curve["points"]] == pytest.approx(
            [rewards[i] for i in mine]
        )
        assert all(p["low"] is None and p["trajectories"] == 1 for p in curve["points"])
        assert [p["success_rate"] for p in curve["points"]] == [
            float(rewards[i] >= 0.5) for i in mine
        ]
    # two buckets (2 hours each): kind-a's i = 0, 4, 8 in the first, 12, 16, 20 in the second
    wide = api.get("/learning-curves", params={"buckets": 2}).json()
    assert wide["bucket_seconds"] == 7200
    kind_a = next(c for c in wide["types"] if c["interaction_type"] == "kind-a")["points"]
    assert [p["trajectories"] for p in kind_a] == [3, 3]
    for point, members in zip(kind_a, ([0, 4, 8], [12, 16, 20]), strict=True):
        values = [rewards[i] for i in members]
        mean = statistics.fmean(values)
        half = 1.959964 * statistics.stdev(values) / math.sqrt(3)
        assert point["mean_reward"] == pytest.approx(mean)
        assert (point["low"], point["high"]) == pytest.approx((mean - half, mean + half))
    assert datetime.fromisoformat(kind_a[1]["t"]) - datetime.fromisoformat(
        kind_a[0]["t"]
    ) == timedelta(hours=2)
    assert "buckets" in error_of(api.get("/learning-curves", params={"buckets": 1}), 400)
    backwards = {"since": datetime.now(UTC).isoformat(), "until": "2020-01-01T00:00:00Z"}
    assert "since" in error_of(api.get("/learning-curves", params=backwards), 400)


def test_export_streams_the_export_format(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    response = api.get("/export", params={"task_key": "task-2"})
    assert response.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in response.text.splitlines()]
    expected_ids = [f"traj{i:03d}" for i in range(N) if i % 3 == 2]
    assert [r["id"] for r in rows] == expected_ids  # oldest first
    assert [r["interaction_type"] for r in rows] == [kind_of(i) for i in range(N) if i % 3 == 2]
    of_type = api.get("/export", params={"type": "kind-a"}).text.splitlines()
    assert [json.loads(line)["id"] for line in of_type] == [
        f"traj{i:03d}" for i in range(N) if kind_of(i) == "kind-a"
    ]
    reference = json.loads(
        json.dumps(list(iter_trajectories(engine, ids=expected_ids)), default=str)
    )
    assert [r["calls"][0]["prompt_token_ids"] for r in rows] == [
        r["calls"][0]["prompt_token_ids"] for r in reference
    ]
    assert set(rows[0]) == set(reference[0])
    assert api.get("/export", params={"session": "none"}).text == ""


def test_the_proxy_refuses_a_non_loopback_bind_without_a_token(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONTHEJOB_ADMIN_TOKEN"}
    refused = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--host", "0.0.0.0", "--port", "9"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "needs an admin token: set ONTHEJOB_ADMIN_TOKEN" in refused.stderr
    assert not (tmp_path / "onthejob.db").exists()  # refused before touching anything
    for host in ("127.0.0.1", "127.0.0.9", "::1", "[::1]", "localhost"):
        Settings(host=host).check_exposure()
    for host in ("0.0.0.0", "::", "10.1.2.3", "proxy.example.com"):
        with pytest.raises(ValueError, match="ONTHEJOB_ADMIN_TOKEN"):
            Settings(host=host, admin_token=None).check_exposure()
        Settings(host=host, admin_token="t").check_exposure()


def test_trajectories_whose_grading_failed_show_why(api: httpx.Client, engine: Engine) -> None:
    seed(engine)
    later = datetime.now(UTC) + timedelta(minutes=5)
    with engine.begin() as conn:
        grade_queue.save_grade(
            conn,
            trajectory_id="traj001",
            reward=None,
            detail={},
            error="judge: Connection error.",
            transient=True,
            retry_at=later,
        )
        grade_queue.save_grade(
            conn, trajectory_id="traj003", reward=None, detail={}, error="command: exited with 2"
        )
    retrying = api.get("/trajectories", params={"grading": "retrying"}).json()["items"]
    assert [t["id"] for t in retrying] == ["traj001"]
    assert retrying[0]["grading_failure"]["state"] == "retrying"
    assert retrying[0]["grading_failure"]["error"] == "judge: Connection error."
    failed = api.get("/trajectories", params={"grading": "failed"}).json()["items"]
    assert [(t["id"], t["grading_failure"]["error"]) for t in failed] == [
        ("traj003", "command: exited with 2")
    ]
    listed = {t["id"]: t for t in api.get("/trajectories").json()["items"]}
    assert listed["traj000"]["grading_failure"] is None
    grade = api.get("/trajectories/traj001", params={"token_text": "false"}).json()["grade"]
    assert grade["transient"] and grade["attempts"] == 1 and grade["retry_at"]
    queue = api.get("/learner").json()["queue"]
    assert queue["grading_retrying"] == 1 and queue["grading_failed"] == 1
    assert "grading" in error_of(api.get("/trajectories", params={"grading": "nope"}), 400)


def _curriculum(tmp_path: Any, stages: list[str]) -> Any:
    from learner.rollout.curriculum import load_curriculum

    lines = ['name = "arith"']
    for name in stages:
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"id": name, "prompt": name}) + "\n")
        lines += [
            "[[stages]]",
            f'name = "{name}"',
            f'tasks = "{name}.jsonl"',
            f'eval = "{name}.jsonl"',
            "promote = { at_least = 0.5, over_last = 1 }",
        ]
    path = tmp_path / "arith.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_curriculum(path)


def test_curricula_show_the_stage_over_time(
    api: httpx.Client, engine: Engine, tmp_path: Any
) -> None:
    from learner.rollout.curriculum import CurriculumError
    from store import curricula as cstore

    assert api.get("/curricula").json() == {"items": []}
    curriculum = _curriculum(tmp_path, ["qa", "tools", "long"])
    metrics = {"runs": 4, "k": 2, "pass_at_1": 0.75, "mean_reward": 0.8, "pass_at_k": 1.0}
    with engine.begin() as conn:
        state = cstore.begin(conn, curriculum)
        assert (state["stage"], state["stage_index"]) == ("qa", 0)
        cstore.record_round(conn, "arith")
        cstore.record_eval(
            conn, "arith", stage="qa", rollout_id="r1", stage_round=1, policy_version="v1",
            **metrics,
        )  # fmt: skip
        cstore.promote(
            conn, "arith", from_stage="qa", to_stage="tools", to_index=1, policy_version="v1",
            metrics={"value": 0.75, "rule": {"metric": "pass_at_1"}},
        )  # fmt: skip
        cstore.record_eval(
            conn, "arith", stage="tools", rollout_id="r2", stage_round=0, policy_version="v2",
            **{**metrics, "pass_at_1": 0.25},
        )  # fmt: skip
    listed = api.get("/curricula").json()["items"]
    assert [c["name"] for c in listed] == ["arith"]
    (item,) = listed
    assert (item["stage"], item["stage_index"], item["complete"]) == ("tools", 1, False)
    assert (item["rounds"], item["stage_rounds"]) == (1, 0)  # the new stage starts at 0
    assert [(s["name"], s["status"]) for s in item["stages"]] == [
        ("qa", "passed"),
        ("tools", "current"),
        ("long", "pending"),
    ]
    assert item["stages"][0]["rule"] == {"metric": "pass_at_1", "at_least": 0.5, "over_last": 1}
    (promotion,) = item["promotions"]
    assert promotion["from_stage"] == "qa" and promotion["to_stage"] == "tools"
    assert promotion["policy_version"] == "v1" and promotion["metrics"]["value"] == 0.75
    first, second = item["timeline"]
    assert (first["stage"], first["until"], first["promoted"]["to_stage"]) == (
        "qa",
        promotion["at"],
        "tools",
    )
    assert (second["stage"], second["since"], second["until"]) == ("tools", promotion["at"], None)
    detail = api.get("/curricula/arith").json()
    assert [(e["stage"], e["policy_version"], e["pass_at_1"]) for e in detail["evals"]] == [
        ("qa", "v1", 0.75),
        ("tools", "v2", 0.25),
    ]
    assert detail["evals"][0]["at"] <= promotion["at"] <= detail["evals"][1]["at"]
    assert [e["rollout_id"] for e in api.get("/curricula/arith?limit=1").json()["evals"]] == ["r2"]
    assert "no curriculum" in error_of(api.get("/curricula/nope"), 404)
    with engine.connect() as conn:  # the rule reads the stage's evals since it began
        since = cstore.state(conn, "arith")["stage_since"]
        assert [
            e["rollout_id"] for e in cstore.stage_evals(conn, "arith", "tools", since=since)
        ] == ["r2"]
        assert cstore.stage_evals(conn, "arith", "qa", since=since) == []

    # a restart resumes at the recorded stage; a file without it is refused
    with engine.begin() as conn:
        assert cstore.begin(conn, curriculum)["stage"] == "tools"
    with pytest.raises(CurriculumError, match="recorded at stage 'tools', which this file"):
        with engine.begin() as conn:
            cstore.begin(conn, _curriculum(tmp_path, ["qa", "long"]))
    with engine.begin() as conn:
        cstore.promote(
            conn, "arith", from_stage="tools", to_stage="long", to_index=2, policy_version="v2",
            metrics={},
        )  # fmt: skip
        cstore.promote(
            conn, "arith", from_stage="long", to_stage=None, to_index=None, policy_version="v3",
            metrics={},
        )  # fmt: skip
        assert cstore.begin(conn, curriculum)["stage"] is None  # done: nothing to resume
    done = api.get("/curricula/arith").json()
    assert done["complete"] and done["stage"] is None and done["completed_at"]
    assert [s["status"] for s in done["stages"]] == ["passed"] * 3
    assert [(t["stage"], t["promoted"]["to_stage"]) for t in done["timeline"]] == [
        ("qa", "tools"),
        ("tools", "long"),
        ("long", None),
    ]
    assert all(t["until"] for t in done["timeline"])


def test_the_regression_guard_decisions_waiver_and_pins(api: httpx.Client, engine: Engine) -> None:
    from store import guard_records as guard_store

    assert api.get("/guard").json() == {
        "config": None, "protected": {}, "waiver": None, "decisions": [],
    }  # fmt: skip
    verdict = {"type": "tools", "protected": True, "metric": "pass_at_1",
               "before": {"value": 0.6, "runs": 32}, "after": {"value": 0.2, "runs": 32},
               "drop": 0.4, "allowed": 0.22, "regressed": True, "waived": False,
               "note": ""}  # fmt: skip
    decision = {"version": "v1", "kept": "v0", "step": 1, "outcome": "rolled_back",
                "reason": "tools (protected) ...", "trained_types": [], "waiver": None,
                "types": [verdict], "at": "2026-12-01T00:00:00+00:00"}  # fmt: skip
    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="v0", ordinal=0, parent=None, checkpoint_path=None, status="superseded"
        )
        policy_versions.add_version(
            conn, version="v1", ordinal=1, parent="v0", checkpoint_path=None, status="superseded"
        )
        policy_versions.add_version(
            conn, version="v2", ordinal=2, parent="v0", checkpoint_path=None, status="serving"
        )
        guard_store.append_decision(conn, decision)
        guard_store.mark_rolled_back(conn, version="v1", serving="v2", decision=decision)
    body = api.get("/guard").json()
    assert [d["version"] for d in body["decisions"]] == ["v1"]
    assert body["decisions"][0]["types"][0]["before"] == {"value": 0.6, "runs": 32}
    # the rolled-back version is flagged, with the numbers, in the versions list
    item = next(v for v in api.get("/versions").json()["items"] if v["version"] == "v1")
    assert item["status"] == "rolled_back" and item["error"].startswith("regression guard: ")
    assert item["guard"]["serving_after"] == "v2" and item["guard"]["types"] == [verdict]

    # a waiver for the next version, read back by the learner's side as written
    put = api.put("/guard/waiver", json={"types": ["qa"], "reason": "on purpose"})
    assert put.json()["waiver"]["types"] == ["qa"]
    with engine.connect() as conn:
        waiver = learner_state.get_state(conn, guard_store.WAIVER)
    assert (waiver["types"], waiver["reason"]) == (["qa"], "on purpose")
    assert api.put("/guard/waiver", json={}).json()["waiver"]["types"] is None  # all unprotected
    assert "types" in error_of(api.put("/guard/waiver", json={"types": [""]}), 400)
    assert "extra" in error_of(api.put("/guard/waiver", json={"typo": 1}), 400).lower()
    assert api.delete("/guard/waiver").json()["waiver"] is None
    assert api.get("/guard").json()["waiver"] is None

    # pins over the file
    assert api.put("/guard/types/qa/protected", json={"protected": True}).json()["protected"] == {
        "qa": True
    }
    with engine.connect() as conn:
        assert guard_store.protected_overrides(conn) == {"qa": True}
    assert api.delete("/guard/types/qa/protected").json()["protected"] == {}
    assert "qa" in error_of(api.delete("/guard/types/qa/protected"), 404)
    assert "protected" in error_of(api.put("/guard/types/qa/protected", json={}), 400)

    # accepting: only a version the guard rolled back (v1 has no checkpoint: not servable)
    assert "not rolled back by the guard" in error_of(api.post("/guard/accept/v0"), 409)
    assert "no policy version" in error_of(api.post("/guard/accept/nope"), 404)
    assert "no checkpoint" in error_of(api.post("/guard/accept/v1"), 409)


def _answered_then_told(
    engine: Engine, trajectory_id: str, *, key: str, told: str, at: float
) -> None:
    """A two-call trajectory of client key `key`: an answer, then the user's `told`."""
    asked = [{"role": "user", "content": "What is 6 x 7?"}]
    after = [*asked, {"role": "assistant", "content": "42"}, {"role": "user", "content": told}]
    calls = [
        chat_call(f"{trajectory_id}a", trajectory_id, started=at, prompt=[1, 2], completion=[3],
                  messages=asked, reply="42", version="v0"),
        chat_call(f"{trajectory_id}b", trajectory_id, started=at + 1, prompt=[1, 2, 3, 4],
                  completion=[5], messages=after, reply="ok", version="v0",
                  parent=f"{trajectory_id}a", prefix_len=3),
    ]  # fmt: skip
    for call in calls:
        call["key_name"] = key
    trajectory = {"id": trajectory_id, "session_key": None, "task_key": "t", "group_key": None,
                  "interaction_type": None, "status": "finished", "started_at": at,
                  "last_call_at": at + 1, "ended_at": None}  # fmt: skip
    with engine.begin() as conn:
        recording.write_batch(conn, trajectories=[trajectory], calls=calls)


def test_stored_signals_by_key_flag_a_one_sided_burst_and_an_off_key_counts_nothing(
    api: httpx.Client, engine: Engine
) -> None:
    """The learner's grading stores each trajectory's signals with its key's weight; a key
    that only ever approves is flagged against the others' mixed verdicts; a key whose
    signals are off gets no next_turn grade, so nothing it says trains."""
    from learner import grading
    from learner.graders import build_graders
    from learner.signals import SignalWeights
    from store.tasks import TaskTable

    now = time.time()
    told = {"mallory": ["Thanks!"] * 24, "alice": ["No, that's wrong."] * 12 + ["Perfect."] * 12,
            "eve": ["Wrong!"] * 3}  # fmt: skip
    ids = []
    for key, replies in told.items():
        for i, text in enumerate(replies):
            ids.append(f"{key}{i}")
            _answered_then_told(engine, ids[-1], key=key, told=text, at=now + len(ids))
    weights = SignalWeights.parse(["eve=0", "alice=0.5"])
    outcome = grading.grade_and_save(
        engine,
        build_graders(["next_turn"], signal_weights=weights),
        list(load_trajectories(engine, ids=ids)),
        tasks=TaskTable(),
        policy=grading.RetryPolicy(),
        signal_weights=weights,
    )
    assert (outcome.rewarded, outcome.failed) == (48, 3)
    with engine.connect() as conn:
        query = select(Grade.trajectory_id, Grade.reward, Grade.error)
        grades = {g.trajectory_id: g for g in conn.execute(query)}
    assert grades["mallory0"].reward == 0.75  # approved (1) and a reply nothing judged (0.5)
    assert grades["alice0"].reward == 0.375  # corrected at weight 0.5: 0.25, and 0.5
    assert grades["eve0"].reward is None and "key eve are off" in grades["eve0"].error
    by_key = {k["key_name"]: k for k in api.get("/signals", params={"hours": 1}).json()["keys"]}
    assert by_key["mallory"]["flagged"] and by_key["mallory"]["words"]["good"] == 24
    assert "24 word signals, 100% good" in by_key["mallory"]["reason"]
    assert "the other keys' are 44% good" in by_key["mallory"]["reason"]  # 12 of 27
    assert not by_key["alice"]["flagged"] and by_key["alice"]["bad"] == 12
    assert not by_key["eve"]["flagged"] and by_key["eve"]["signals"] == 3  # shown, not counted
    [stored] = api.get("/trajectories/eve0", params={"token_text": "false"}).json()["signals"]
    assert (stored["rule"], stored["value"], stored["weight"]) == ("corrected", -1.0, 0.0)
    assert "hours" in error_of(api.get("/signals", params={"hours": 0}), 400)
