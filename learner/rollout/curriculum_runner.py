"""`onthejob rollout --curriculum FILE`: move through a curriculum's stages by itself.

At its current stage (the one recorded in the store, so a restart resumes there) the runner
alternates an eval of the stage's split (the rollout runner in eval mode) with
`eval_every` training rounds. A training round is one rollout of `tasks_per_round` tasks
drawn from the stage's training set, `replay_count()` of them from earlier stages' training
sets instead (each run with its own stage's command), G runs each: GRPO groups the learner
trains on, as for any rollout. After each eval the stage's promotion rule is checked over
its evals since it became current; when it holds, the promotion (from, to, the version
that answered the eval, the metrics that passed) is recorded and the next stage starts
with an eval of its own split at once. It stops when the last stage is passed, at a cap
(training rounds, minutes), on Ctrl-C / `stop`, or when every run of a rollout failed
(a harness that cannot work would otherwise loop until the cap).

Each round and eval prints one line (`say`). With `step_wait`, once the runs with a training
signal since the learner's last step make a batch of the running learner's (its heartbeat
says how many), the runner waits up to that long for the learner's next step to be served,
so the next round samples from the newest policy (on-policy GRPO learns faster).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, TypedDict

from sqlalchemy import Engine

from learner.rollout import proxy_store
from learner.rollout.curriculum import Curriculum, EvalPoint, Stage, metric_label
from learner.rollout.progress import ProgressBar
from learner.rollout.report import EvalResult, pass_at_k
from learner.rollout.runner import RolloutConfig, RolloutSummary, RunResult, run_rollout
from learner.rollout.taskset import TaskSet
from store import clock, db, policy_versions, schema, training_steps
from store import curricula as cstore
from store.control import read_heartbeat
from store.curricula import CurriculumState, EvalRow, PromotionRow
from store.json_types import JsonObject
from store.tasks import Task, TaskTable

log = logging.getLogger("onthejob.curriculum")


class CurriculumFailed(RuntimeError):
    """The curriculum cannot go on (every run of a rollout failed); the message says why."""


@dataclass
class CurriculumConfig:
    curriculum: Curriculum
    # proxy, database, command (the default for stages without one), group size,
    # concurrency, timeouts, grader, ...: what every rollout of the curriculum shares
    rollout: RolloutConfig
    max_rounds: int | None = None  # training rounds in this invocation
    minutes: float | None = None  # no round or eval starts after this long
    step_wait: float = 0.0  # see the module docstring
    progress: bool = True  # a progress bar per rollout (stderr)

    def __post_init__(self) -> None:
        if self.max_rounds is not None and self.max_rounds < 0:
            raise ValueError("max_rounds must not be negative")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError("minutes must be positive")
        if self.step_wait < 0:
            raise ValueError("step_wait must not be negative")


class EvalMetrics(TypedDict):
    """One eval's numbers (`eval_metrics`), as the curriculum's eval record takes them."""

    runs: int
    k: int
    pass_at_1: float | None  # None: no run was graded
    mean_reward: float | None
    pass_at_k: float | None
    policy_version: str | None  # the version with most runs


@dataclass
class CurriculumSummary:
    name: str
    started_at_stage: str | None  # None: it was complete already
    stage: str | None  # where it stands now; None: every stage passed
    rounds: int  # training rounds in this invocation
    evals: list[EvalRow] = field(default_factory=list)
    promotions: list[PromotionRow] = field(default_factory=list)
    runs: list[RunResult] = field(default_factory=list)
    stopped_by: str = ""  # complete | max_rounds | minutes | cancelled

    @property
    def complete(self) -> bool:
        return self.stage is None

    @property
    def cancelled(self) -> bool:
        return self.stopped_by == "cancelled"


def eval_metrics(rows: list[EvalResult], *, k: int) -> EvalMetrics:
    """One eval's numbers from its eval_results rows (per task and policy version): runs
    pooled across versions, pass@k per task then averaged, the version with most runs."""
    runs = sum(r["runs"] for r in rows)
    if not runs:
        return {"runs": 0, "k": k, "pass_at_1": None, "mean_reward": None, "pass_at_k": None,
                "policy_version": None}  # fmt: skip
    per_task: dict[str, list[int]] = {}
    by_version: Counter[str | None] = Counter()
    for r in rows:
        n_c = per_task.setdefault(r["task_key"], [0, 0])
        n_c[0] += r["runs"]
        n_c[1] += r["successes"]
        by_version[r["policy_version"]] += r["runs"]
    return {
        "runs": runs,
        "k": k,
        "pass_at_1": sum(r["successes"] for r in rows) / runs,
        "mean_reward": sum(r["mean_reward"] * r["runs"] for r in rows) / runs,
        "pass_at_k": sum(pass_at_k(n, c, k) for n, c in per_task.values()) / len(per_task),
        "policy_version": by_version.most_common(1)[0][0],
    }


def run_curriculum(
    config: CurriculumConfig,
    *,
    say: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> CurriculumSummary:
    """Run the curriculum from its recorded stage until it is complete or a cap is hit.
    Raises proxy_store.StoreMismatch (before anything runs) or CurriculumFailed."""
    rollout = config.rollout
    rollout.database_url = proxy_store.resolve(rollout.proxy_url, rollout.database_url)
    schema.require(rollout.database_url, migrate=rollout.migrate, who="curriculum runner")
    engine = db.make_engine(rollout.database_url)
    try:
        return _Run(config, engine, say or _print, stop or threading.Event()).run()
    finally:
        engine.dispose()


def _print(line: str) -> None:
    print(line, flush=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


class _Run:
    def __init__(
        self,
        config: CurriculumConfig,
        engine: Engine,
        say: Callable[[str], None],
        stop: threading.Event,
    ) -> None:
        self.config = config
        self.curriculum = config.curriculum
        self.engine = engine
        self.say_line = say
        self.stop = stop
        self.rng = random.Random(
            f"onthejob-curriculum-{self.curriculum.name}-{self.curriculum.seed}"
        )
        self.pending = 0  # runs with a training signal since the learner's last step
        self.deadline = None if config.minutes is None else time.monotonic() + 60 * config.minutes
        # which stage each training task belongs to: replayed runs use their stage's command
        self.stage_of: dict[str, Stage] = {}
        for stage in self.curriculum.stages:
            for key in stage.tasks.tasks:
                self.stage_of.setdefault(key, stage)

    def say(self, message: str) -> None:
        self.say_line(f"[curriculum {self.curriculum.name}] {message}")

    def where(self, stage: Stage) -> str:
        return f"stage {stage.index + 1}/{len(self.curriculum.stages)} {stage.name!r}"

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> CurriculumSummary:
        with self.engine.begin() as conn:
            state = cstore.begin(conn, self.curriculum)
        summary = CurriculumSummary(self.curriculum.name, state["stage"], state["stage"], 0)
        if state["stage"] is None:
            self.say(
                f"every stage is passed already (since {state['completed_at']:%Y-%m-%d %H:%M})"
            )
            summary.stopped_by = "complete"
            return summary
        stage = self.curriculum.stages[state["stage_index"]]
        fresh = not state["rounds"] and state["last_eval_round"] is None and stage.index == 0
        self.say(
            f"{'starting at' if fresh else 'resuming at'} {self.where(stage)} "
            f"({state['stage_rounds']} training rounds in it so far); promotion: "
            f"{stage.rule.describe()}"
        )
        while True:
            due = state["last_eval_round"] is None or (
                state["stage_rounds"] - state["last_eval_round"] >= stage.eval_every
            )
            if self._time_up():
                summary.stopped_by = "minutes"
                break
            if due:
                promoted = self._eval(stage, state, summary)
                if promoted is _CANCELLED:
                    summary.stopped_by = "cancelled"
                    break
                state = self._state()
                if promoted:
                    if state["stage"] is None:
                        summary.stage = None
                        summary.stopped_by = "complete"
                        self.say("every stage is passed")
                        break
                    stage = self.curriculum.stages[state["stage_index"]]
                    summary.stage = stage.name
                    self.say(f"now at {self.where(stage)}; promotion: {stage.rule.describe()}")
                continue  # a new stage is evaluated at once; else train first
            if self.config.max_rounds is not None and summary.rounds >= self.config.max_rounds:
                summary.stopped_by = "max_rounds"
                break
            if not self._round(stage, state, summary):
                summary.stopped_by = "cancelled"
                break
            state = self._state()
        self.say(
            f"stopped ({summary.stopped_by}) after {summary.rounds} training rounds, "
            f"{len(summary.evals)} evals, {len(summary.promotions)} promotions; at "
            + ("the end: every stage passed" if summary.stage is None else self.where(stage))
        )
        return summary

    def _time_up(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _state(self) -> CurriculumState:
        with self.engine.connect() as conn:
            state = cstore.state(conn, self.curriculum.name)
        assert state is not None  # made by begin(); never deleted
        return state

    def _command(self, stage: Stage) -> list[str]:
        return stage.command or self.config.rollout.command

    def _rollout(
        self, tasks: TaskSet, command: list[str], *, group_size: int, eval: bool, label: str
    ) -> RolloutSummary:
        config = dataclasses.replace(
            self.config.rollout, tasks=tasks, command=command, group_size=group_size,
            epochs=1, eval=eval,
        )  # fmt: skip
        bar = ProgressBar(label, disable=not self.config.progress)
        try:
            return run_rollout(config, on_progress=bar.update, stop=self.stop)
        finally:
            bar.close()

    # -- a training round ---------------------------------------------------------------------
    def _pick(self, stage: Stage) -> tuple[list[Task], list[Task]]:
        earlier = self.curriculum.earlier_tasks(stage)
        replay_n = min(stage.replay_count(), len(earlier))
        replayed = [earlier[k] for k in self.rng.sample(sorted(earlier), replay_n)]
        own_keys = sorted(stage.tasks.tasks)
        own_n = min(stage.tasks_per_round - replay_n, len(own_keys))
        own = [stage.tasks.tasks[k] for k in self.rng.sample(own_keys, own_n)]
        return own, replayed

    def _round(self, stage: Stage, state: CurriculumState, summary: CurriculumSummary) -> bool:
        own, replayed = self._pick(stage)
        by_command: dict[tuple[str, ...], dict[str, Task]] = {}
        for task in own:
            by_command.setdefault(tuple(self._command(stage)), {})[task.key] = task
        for task in replayed:
            command = tuple(self._command(self.stage_of[task.key]))
            by_command.setdefault(command, {})[task.key] = task
        number = state["stage_rounds"] + 1
        steps_before = self._steps()
        runs: list[RunResult] = []
        cancelled = False
        for command, tasks in by_command.items():
            result = self._rollout(
                TaskSet(stage.tasks.name, TaskTable(tasks)),
                list(command),
                group_size=self.config.rollout.group_size,
                eval=False,
                label=f"{stage.name} round {number}",
            )
            runs += result.runs
            if result.cancelled:
                cancelled = True
                break
        summary.runs += runs
        if cancelled:
            return False
        with self.engine.begin() as conn:
            cstore.record_round(conn, self.curriculum.name)
        summary.rounds += 1
        rewards = [r.reward for r in runs if r.reward is not None]
        threshold = self.config.rollout.success_threshold
        success = sum(r >= threshold for r in rewards) / len(rewards) if rewards else None
        replayed_keys = {t.key for t in replayed}
        n_replayed = sum(r.task_key in replayed_keys for r in runs)
        versions = sorted({r.policy_version for r in runs if r.policy_version})
        self.say(
            f"{self.where(stage)} round {number}: {len(runs)} runs "
            f"({len(runs) - n_replayed} of the stage, {n_replayed} replayed), "
            f"success {_fmt(success)}, mean reward "
            f"{_fmt(sum(rewards) / len(rewards) if rewards else None)}; "
            f"served by {', '.join(versions) or '-'}"
        )
        if not rewards:
            raise CurriculumFailed(
                f"every run of {stage.name} round {number} failed without a reward: "
                + (next((r.error for r in runs if r.error), None) or "no error recorded")
            )
        self.pending += signal_runs(runs)
        if self.config.step_wait > 0:
            # the learner steps once a batch of trajectories carries a signal: short of that
            # no step can come of waiting, so the next round goes on at once
            batch = self._learner_batch()
            if batch is not None and self.pending >= batch:
                self._wait_for_step(steps_before)
        if self._steps() > steps_before:
            self.pending = 0
        return True

    # -- an eval --------------------------------------------------------------------------------
    def _eval(self, stage: Stage, state: CurriculumState, summary: CurriculumSummary) -> Any:
        result = self._rollout(
            stage.eval,
            self._command(stage),
            group_size=stage.eval_samples,
            eval=True,
            label=f"{stage.name} eval",
        )
        summary.runs += result.runs
        if result.cancelled:
            return _CANCELLED  # a part of an eval says nothing: not recorded
        metrics = eval_metrics(result.eval_rows, k=stage.eval_samples)
        if not metrics["runs"]:
            raise CurriculumFailed(
                f"every run of the {stage.name} eval failed without a reward: "
                + (next((r.error for r in result.runs if r.error), None) or "no error recorded")
            )
        with self.engine.begin() as conn:
            row = cstore.record_eval(
                conn,
                self.curriculum.name,
                stage=stage.name,
                rollout_id=result.rollout_id,
                stage_round=state["stage_rounds"],
                **metrics,
            )
            evals = cstore.stage_evals(
                conn, self.curriculum.name, stage.name, since=state["stage_since"]
            )
        summary.evals.append(row)
        verdict = stage.rule.check([EvalPoint(e) for e in evals])
        rule = stage.rule
        self.say(
            f"{self.where(stage)} eval {len(evals)} (after {state['stage_rounds']} training "
            f"rounds): pass@1 {_fmt(metrics['pass_at_1'])}, mean reward "
            f"{_fmt(metrics['mean_reward'])}, pass@{stage.eval_samples} "
            f"{_fmt(metrics['pass_at_k'])} on {metrics['runs']} runs, by "
            f"{metrics['policy_version'] or '-'}; {rule.describe()}: "
            f"{_fmt(verdict.value)} ({verdict.evals} of {rule.over_last} evals) -> "
            + ("promoted" if verdict.holds else "not yet")
        )
        if not verdict.holds:
            return False
        following = (
            self.curriculum.stages[stage.index + 1]
            if stage.index + 1 < len(self.curriculum.stages)
            else None
        )
        window = evals[-rule.over_last :]
        with self.engine.begin() as conn:
            serving = policy_versions.serving_version(conn)
            promotion = cstore.promote(
                conn,
                self.curriculum.name,
                from_stage=stage.name,
                to_stage=None if following is None else following.name,
                to_index=None if following is None else following.index,
                policy_version=metrics["policy_version"],
                metrics={
                    "rule": rule.state(),
                    "metric": rule.metric,
                    "value": verdict.value,
                    "stage_rounds": state["stage_rounds"],
                    # the version the store had serving when the rule held (the learner's)
                    "serving": None if serving is None else serving["version"],
                    "evals": [_eval_state(e) for e in window],
                },
            )
        summary.promotions.append(promotion)
        self.say(
            f"promoted {stage.name!r} -> "
            + ("(the end)" if following is None else repr(following.name))
            + f" at version {metrics['policy_version'] or '-'}: {metric_label(rule.metric)} "
            f"{_fmt(verdict.value)} >= {rule.at_least:g} over the last {rule.over_last} evals, "
            f"after {state['stage_rounds']} training rounds"
        )
        return True

    # -- waiting for the learner ----------------------------------------------------------------
    def _steps(self) -> int:
        with self.engine.connect() as conn:
            return training_steps.step_count(conn)

    def _learner_batch(self) -> int | None:
        """The running learner's batch size (from its heartbeat); None: no learner seen."""
        with self.engine.connect() as conn:
            heartbeat = read_heartbeat(conn)
        batch = (heartbeat or {}).get("batch_trajectories")
        return int(batch) if isinstance(batch, int) else None

    def _wait_for_step(self, steps_before: int) -> None:
        """Until the learner has stepped and the proxy routes to the version it made."""
        until = time.monotonic() + self.config.step_wait
        while time.monotonic() < until and not self.stop.is_set():
            if self._steps() > steps_before:
                with self.engine.connect() as conn:
                    serving = policy_versions.serving_version(conn)
                if (
                    serving is not None
                    and proxy_version(self.config.rollout.proxy_url) == serving["version"]
                ):
                    return
            self.stop.wait(0.5)


_CANCELLED = object()


def _eval_state(row: EvalRow) -> JsonObject:
    keep = ("rollout_id", "policy_version", "stage_round", "runs", "k")
    out = {key: row[key] for key in keep}
    out.update({m: row[m] for m in ("pass_at_1", "mean_reward", "pass_at_k")})
    out["at"] = clock.as_utc(row["created_at"]).astimezone(UTC).isoformat()
    return out


def signal_runs(runs: list[RunResult]) -> int:
    """How many runs belong to a task whose runs got different rewards: the GRPO groups the
    learner trains on (a group whose runs all scored alike teaches nothing)."""
    rewards: dict[str, list[float]] = {}
    for run in runs:
        if run.reward is not None:
            rewards.setdefault(run.task_key, []).append(run.reward)
    return sum(len(seen) for seen in rewards.values() if len(set(seen)) > 1)


def proxy_version(proxy_url: str) -> str | None:
    try:
        with urllib.request.urlopen(proxy_url.rstrip("/") + "/healthz", timeout=5) as answer:
            upstreams = json.loads(answer.read())["upstreams"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None
    return upstreams[0].get("policy_version") if upstreams else None
