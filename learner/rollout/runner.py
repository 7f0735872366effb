"""The rollout runner: every task x group size x epochs, a harness run, graded and stored.

Runs go through a pool of `concurrency` worker threads, each owning one harness process
group at a time. Progress is reported from the calling thread only (tqdm, or a callback).
A cancel (Ctrl-C, or the `stop` event) terminates every running harness, lets each worker
record its run as cancelled, never starts another run, and keeps what finished.
Invariant: when `run_rollout` returns, no run of it is left `running` in the database.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import Engine

from learner.graders.base import Grade
from learner.graders.combine import build_graders
from learner.rollout import proxy_store
from learner.rollout.grading import SpecGraders, grade_run, run_check
from learner.rollout.harness import (
    ProcessResult,
    Running,
    clip,
    harness_env,
    run_process,
    snapshot,
    substitute_prompt,
)
from learner.rollout.report import EvalResult, summarise
from learner.rollout.taskset import TaskSet, store_tasks
from learner.signals import signals_in
from store import db, rollouts, schema
from store.tasks import Task
from store.trajectory_loading import load_trajectories
from store.trajectory_record import Trajectory

log = logging.getLogger("onthejob.rollout")

NO_CALLS = (
    "the harness exited 0, but none of its calls reached the proxy's store under its "
    "session key: does it use the base URL it was given (OPENAI_BASE_URL, ANTHROPIC_BASE_URL)?"
)


@dataclass
class RolloutConfig:
    proxy_url: str  # the onthejob proxy, e.g. http://127.0.0.1:8080
    command: list[str]  # the harness; `{prompt}` in an argument is replaced by the prompt
    tasks: TaskSet
    # the proxy's database; None: the one the proxy says it records to (see proxy_store)
    database_url: str | None
    group_size: int = 4  # runs per task and epoch: one GRPO group
    concurrency: int = 4
    epochs: int = 1
    timeout: float | None = 600.0  # per harness run; then it is killed and "timeout"
    eval: bool = False  # no training signal; eval_results per task and policy version
    grader: str | None = None  # a learner grader SPEC for tasks without check/grader
    failure_reward: float | None = 0.0  # timeout / non-zero exit; None: not trained on
    success_threshold: float = 1.0  # eval: a run with at least this reward succeeded
    setup_timeout: float = 120.0
    check_timeout: float = 120.0
    settle: float = 1.0  # a run's recorded calls are in once unchanged this long
    record_wait: float = 15.0  # at most this long after the harness ended
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the harness
    workdir_root: Path | None = None  # where run directories are made (default: temp)
    keep_workdirs: bool = False
    migrate: bool = False  # upgrade a schema that is behind (store/schema.py), else refuse

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("no harness command given")
        for name in ("group_size", "concurrency", "epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if not self.proxy_url.startswith(("http://", "https://")):
            raise ValueError(f"proxy URL must be http(s): {self.proxy_url!r}")
        self.proxy_url = self.proxy_url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class RunResult:
    run_id: str
    task_key: str
    epoch: int
    sample: int
    status: str  # ok | failed | timeout | cancelled
    reward: float | None
    exit_code: int | None
    policy_version: str | None
    trajectory_ids: list[str]
    error: str | None


@dataclass(frozen=True)
class Progress:
    total: int
    done: int
    running: int
    failed: int  # failed or timed out
    cancelled: int
    mean_reward: float | None  # over the runs with a reward so far
    last: RunResult | None  # the run that just ended (None: one just started)


@dataclass
class RolloutSummary:
    rollout_id: str
    task_set: str
    eval: bool
    runs: list[RunResult]
    cancelled: bool
    eval_rows: list[EvalResult]  # eval mode: per task and policy version

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.runs if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None


@dataclass(frozen=True)
class _Job:
    task: Task
    epoch: int
    sample: int


ProgressCallback = Callable[[Progress], None]


def run_rollout(
    config: RolloutConfig,
    *,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
) -> RolloutSummary:
    """Run the whole rollout; KeyboardInterrupt or `stop` cancels it cleanly (see module).
    Raises proxy_store.StoreMismatch before any run if it would not read the proxy's store."""
    config.database_url = proxy_store.resolve(config.proxy_url, config.database_url)
    schema.require(config.database_url, migrate=config.migrate, who="rollout runner")
    engine = db.make_engine(config.database_url)
    try:
        return _Rollout(config, engine, on_progress, stop or threading.Event()).run()
    finally:
        engine.dispose()


class _Rollout:
    def __init__(
        self,
        config: RolloutConfig,
        engine: Engine,
        on_progress: ProgressCallback | None,
        stop: threading.Event,
    ) -> None:
        self.config = config
        self.engine = engine
        self.on_progress = on_progress
        self.stop = stop
        self.rollout_id = os.urandom(8).hex()
        self.running = Running()
        # a judge without a URL of its own is the served model, asked through the proxy
        # (recorded as judge traffic, never trained on)
        judge_url = config.proxy_url.rstrip("/") + "/v1"
        self.specs = SpecGraders(lambda spec: build_graders([spec], judge_base_url=judge_url))
        self.events: queue.Queue[RunResult | None] = queue.Queue()
        self.results: list[RunResult] = []
        self.in_progress = 0
        self.jobs = [
            _Job(task, epoch, sample)
            for epoch in range(config.epochs)
            for task in config.tasks.tasks.values()
            for sample in range(config.group_size)
        ]

    # -- the calling thread ---------------------------------------------------------------
    def run(self) -> RolloutSummary:
        with self.engine.begin() as conn:
            store_tasks(conn, self.config.tasks)
        cancelled = False
        pool = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="rollout")
        try:
            pending: set[Future[None]] = {pool.submit(self._worker, job) for job in self.jobs}
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                self._drain()
                if self.stop.is_set():
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            cancelled = True
            self._cancel(pool)
        except BaseException:  # e.g. the progress callback failed: stop the harnesses too
            self._cancel(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            with self.engine.begin() as conn:
                rollouts.cancel_unfinished(conn, rollout_id=self.rollout_id)
        self._drain()
        if self._reconcile():
            log.info("picked up runs whose calls were recorded late")
        self.specs.close()
        eval_rows = self._eval_results() if self.config.eval else []
        return RolloutSummary(
            self.rollout_id,
            self.config.tasks.name,
            self.config.eval,
            self.results,
            cancelled,
            eval_rows,
        )

    def _cancel(self, pool: ThreadPoolExecutor) -> None:
        log.warning("cancelling: terminating running harnesses, keeping finished runs")
        self.running.cancel()
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _drain(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            if event is None:
                self.in_progress += 1
            else:
                self.in_progress -= 1
                self.results.append(event)
            if self.on_progress is not None:
                self.on_progress(self._progress(event))

    def _progress(self, last: RunResult | None) -> Progress:
        rewards = [r.reward for r in self.results if r.reward is not None]
        return Progress(
            total=len(self.jobs),
            done=len(self.results),
            running=self.in_progress,
            failed=sum(r.status in ("failed", "timeout") for r in self.results),
            cancelled=sum(r.status == "cancelled" for r in self.results),
            mean_reward=sum(rewards) / len(rewards) if rewards else None,
            last=last,
        )

    def _eval_results(self) -> list[EvalResult]:
        with self.engine.begin() as conn:
            runs = rollouts.runs_of(conn, rollout_id=self.rollout_id)
            rows = summarise(
                runs, k=self.config.group_size, threshold=self.config.success_threshold
            )
            rollouts.add_eval_results(conn, rows)
        return rows

    # -- worker threads -------------------------------------------------------------------
    def _worker(self, job: _Job) -> None:
        if self.running.cancelled.is_set():
            return
        run_id = os.urandom(16).hex()
        session = rollouts.session_key_for(run_id)
        with self.engine.begin() as conn:
            rollouts.start_run(
                conn,
                id=run_id,
                rollout_id=self.rollout_id,
                task_set=self.config.tasks.name,
                task_key=job.task.key,
                epoch=job.epoch,
                sample=job.sample,
                session_key=session,
                eval=self.config.eval,
                command=self.config.command,
            )
        self.events.put(None)
        try:
            result = self._run(job, run_id, session)
        except Exception as exc:  # a bug or a database error: this run fails, not the rollout
            log.exception("run %s failed", run_id)
            result = self._record_crash(job, run_id, exc)
        self.events.put(result)

    def _run(self, job: _Job, run_id: str, session: str) -> RunResult:
        task, config = job.task, self.config
        prompt = task.prompt or ""
        env = harness_env(
            {**os.environ, **config.env},
            proxy_url=config.proxy_url,
            session_key=session,
            prompt=prompt,
            task_key=task.key,
        )
        workdir = Path(tempfile.mkdtemp(prefix="onthejob-run-", dir=config.workdir_root))
        try:
            setup_error = self._setup(task, workdir, env)
            if setup_error is not None:
                cancelled = self.running.cancelled.is_set()
                process = ProcessResult(None, "", "", error=setup_error, cancelled=cancelled)
            else:
                process = run_process(
                    substitute_prompt(config.command, prompt),
                    cwd=workdir,
                    env=env,
                    stdin=prompt,
                    timeout=config.timeout,
                    running=self.running,
                )
            return self._finish(job, run_id, session, process, workdir, env)
        finally:
            if not config.keep_workdirs:
                shutil.rmtree(workdir, ignore_errors=True)

    def _setup(self, task: Task, workdir: Path, env: dict[str, str]) -> str | None:
        if task.setup is None:
            return None
        result = run_process(
            [task.setup],
            shell=True,
            cwd=workdir,
            env=env,
            stdin="",
            timeout=self.config.setup_timeout,
            running=self.running,
        )
        if result.error or result.timed_out or result.exit_code != 0:
            reason = result.error or (
                "timed out" if result.timed_out else f"exit {result.exit_code}"
            )
            return f"setup failed ({reason}): {clip(result.stderr, 500)}"
        return None

    def _finish(
        self,
        job: _Job,
        run_id: str,
        session: str,
        process: ProcessResult,
        workdir: Path,
        env: dict[str, str],
    ) -> RunResult:
        # a harness that exited normally has surely called the model: wait for its calls
        self._wait_for_records(session, expect_calls=process.exit_code == 0)
        with self.engine.connect() as conn:
            ids = rollouts.trajectory_ids(conn, session_key=session)
            version = rollouts.first_policy_version(conn, session_key=session)
        group_key = rollouts.group_key_for(self.rollout_id, job.epoch, job.task.key, version)
        status, grade = self._status_and_grade(job.task, process, ids, workdir, env)
        files = snapshot(workdir)
        with self.engine.begin() as conn:
            rollouts.stamp_trajectories(conn, ids=ids, task_key=job.task.key, group_key=group_key)
            rollouts.save_grades(
                conn,
                ids=ids,
                reward=grade.reward,
                detail={"rollout_run": run_id, **grade.detail},
                error=grade.error,
                trainable=not self.config.eval,
                signals=signals_in(grade.detail),
            )
            rollouts.finish_run(
                conn,
                run_id=run_id,
                status=status,
                exit_code=process.exit_code,
                stdout=clip(process.stdout),
                stderr=clip(process.stderr),
                workdir=files,
                policy_version=version,
                trajectory_ids=ids,
                group_key=group_key,
                reward=grade.reward,
                grade_detail=grade.detail,
                error=grade.error,
            )
        return RunResult(
            run_id,
            job.task.key,
            job.epoch,
            job.sample,
            status,
            grade.reward,
            process.exit_code,
            version,
            ids,
            grade.error,
        )

    def _status_and_grade(
        self,
        task: Task,
        process: ProcessResult,
        ids: list[str],
        workdir: Path,
        env: dict[str, str],
    ) -> tuple[str, Grade]:
        failure = self.config.failure_reward
        if process.cancelled:
            return "cancelled", Grade.failed("cancelled")
        if process.error is not None:  # not the model's doing: no reward either way
            return "failed", Grade.failed(process.error)
        if process.timed_out:
            message = f"harness timed out after {self.config.timeout:g}s"
            return "timeout", self._failure(failure, message)
        if process.exit_code != 0:
            return "failed", self._failure(failure, f"harness exited with {process.exit_code}")
        trajectories = self._of_task(ids, task)
        grade = grade_run(
            task,
            tasks=self.config.tasks.tasks,
            default_grader=self.config.grader,
            specs=self.specs,
            trajectories=trajectories,
            stdout=process.stdout,
            check=lambda: run_check(
                task,
                workdir=workdir,
                stdout=process.stdout,
                env=env,
                timeout=self.config.check_timeout,
                running=self.running,
            ),
        )
        if grade.error == "cancelled":
            return "cancelled", grade
        if not ids:
            # not the model's doing: no reward. The grade it would have had is kept, for
            # calls recorded late (_reconcile)
            kept = {"reward": grade.reward, "detail": grade.detail, "error": grade.error}
            return "failed", Grade.failed(NO_CALLS, graded_without_calls=kept)
        return "ok", grade

    def _of_task(self, ids: list[str], task: Task) -> list[Trajectory]:
        """The run's trajectories with the task's key, which the store has only once the
        grade is saved (stamped in the same transaction)."""
        if not ids:
            return []
        return [replace(t, task_key=task.key) for t in load_trajectories(self.engine, ids=ids)]

    @staticmethod
    def _failure(reward: float | None, message: str) -> Grade:
        if reward is None:
            return Grade.failed(message)
        return Grade(reward=reward, detail={"failure": message})

    def _wait_for_records(self, session: str, *, expect_calls: bool) -> None:
        """Until the run's recorded call count stopped changing for `settle` seconds (the
        proxy writes records in the background, shortly after each call's end), and is not
        zero if calls are expected; at most `record_wait` seconds. What comes later still
        is picked up by `_reconcile` at the end of the rollout."""
        start = time.monotonic()
        last, since = -1, start
        while time.monotonic() - start < self.config.record_wait:
            with self.engine.connect() as conn:
                count = rollouts.call_count(conn, session_key=session)
            if count != last:
                last, since = count, time.monotonic()
            elif time.monotonic() - since >= self.config.settle and (count or not expect_calls):
                return
            time.sleep(0.1)
        log.warning("run %s: its calls were not all in after %gs", session, self.config.record_wait)

    def _reconcile(self) -> int:
        """Runs whose trajectories were recorded only after the run was finished: stamp and
        grade them now (with the run's grade; a grade that needed the trajectory is redone)."""
        with self.engine.connect() as conn:
            runs = rollouts.runs_of(conn, rollout_id=self.rollout_id)
        orphans = [r for r in runs if not r["trajectory_ids"] and r["status"] != "running"]
        fixed = 0
        for run in orphans:
            with self.engine.connect() as conn:
                ids = rollouts.trajectory_ids(conn, session_key=run["session_key"])
                version = rollouts.first_policy_version(conn, session_key=run["session_key"])
            if not ids:
                continue
            task = self.config.tasks.tasks[run["task_key"]]
            grade = Grade(run["reward"], run["grade_detail"] or {}, run["error"])
            status = run["status"]
            if status == "failed" and run["error"] == NO_CALLS:
                # its calls came after all: the grade it had without them, redone below
                # if it needed them
                kept = (run["grade_detail"] or {}).get("graded_without_calls") or {}
                status = "ok"
                grade = Grade(kept.get("reward"), kept.get("detail") or {}, kept.get("error"))
            if status == "ok" and grade.error and "no trajectory" in grade.error:
                trajectories = self._of_task(ids, task)
                grade = grade_run(
                    task,
                    tasks=self.config.tasks.tasks,
                    default_grader=self.config.grader,
                    specs=self.specs,
                    trajectories=trajectories,
                    stdout=run["stdout"] or "",
                    check=lambda kept=grade: kept,  # a check never needs the trajectory
                )
            group_key = rollouts.group_key_for(self.rollout_id, run["epoch"], task.key, version)
            with self.engine.begin() as conn:
                rollouts.stamp_trajectories(conn, ids=ids, task_key=task.key, group_key=group_key)
                rollouts.save_grades(
                    conn,
                    ids=ids,
                    reward=grade.reward,
                    detail={"rollout_run": run["id"], **grade.detail},
                    error=grade.error,
                    trainable=not self.config.eval,
                    signals=signals_in(grade.detail),
                )
                rollouts.update_run(
                    conn,
                    run_id=run["id"],
                    status=status,
                    trajectory_ids=ids,
                    policy_version=version,
                    group_key=group_key,
                    reward=grade.reward,
                    grade_detail=grade.detail,
                    error=grade.error,
                )
            fixed += 1
        return fixed

    def _record_crash(self, job: _Job, run_id: str, exc: Exception) -> RunResult:
        error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception), self.engine.begin() as conn:
            rollouts.finish_run(conn, run_id=run_id, status="failed", error=clip(error, 2000))
        return RunResult(
            run_id, job.task.key, job.epoch, job.sample, "failed", None, None, None, [], error
        )
