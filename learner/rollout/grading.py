"""The reward of one finished run, decided by the runner (the learner never re-grades it).

Per task, the first that applies: its `check` command (run in the working directory with
the harness's stdout on stdin: the last line of its output if that is a number, else 1.0 for
exit code 0 and 0.0 otherwise), its `grader` SPEC, the rollout's `--grader` SPEC (learner
graders on the recorded trajectory), its reference `answer` (against the final assistant
message, then against the harness's stdout: either matching scores 1.0).
Invariant: never raises for a bad run; a run that cannot be graded gets a Grade with `error`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from learner.graders.base import Grade
from learner.graders.combine import CombinedGrader, build_graders
from learner.graders.extract import final_answer
from learner.graders.reference import match
from learner.rollout.harness import Running, clip, run_process
from store.json_types import JsonObject
from store.tasks import Task, TaskTable
from store.trajectory_record import Trajectory

DETAIL_CHARS = 500


def reward_from_check(exit_code: int | None, output: str) -> float:
    """The last non-empty line as a number if it is one, else exit code 0 -> 1.0, else 0.0."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if lines:
        try:
            value = float(lines[-1])
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    return 1.0 if exit_code == 0 else 0.0


def run_check(
    task: Task,
    *,
    workdir: Path,
    stdout: str,
    env: Mapping[str, str],
    timeout: float,
    running: Running,
) -> Grade:
    assert task.check is not None
    result = run_process(
        [task.check],
        shell=True,
        cwd=workdir,
        env=env,
        stdin=stdout,
        timeout=timeout,
        running=running,
    )
    detail: JsonObject = {
        "check": task.check,
        "exit_code": result.exit_code,
        "output": clip(result.stdout, DETAIL_CHARS),
        "stderr": clip(result.stderr, DETAIL_CHARS),
    }
    if result.error:
        return Grade.failed(result.error, **detail)
    if result.timed_out:
        return Grade.failed(f"check timed out after {timeout:g}s", **detail)
    if result.cancelled:
        return Grade.failed("cancelled", **detail)
    return Grade(reward=reward_from_check(result.exit_code, result.stdout), detail=detail)


def grade_reference(task: Task, *, trajectories: list[Trajectory], stdout: str) -> Grade:
    assert task.answer is not None
    candidates = [("final_message", final_answer(t)) for t in reversed(trajectories)][:1]
    candidates.append(("stdout", stdout))
    for source, text in candidates:
        if text is None:
            continue
        matched, found = match(text, answer=task.answer, kind=task.match, tol=task.tolerance)
        if matched:
            return Grade(
                reward=1.0,
                detail={
                    "reference": task.answer,
                    "match": task.match,
                    "source": source,
                    "found": found,
                },
            )
    return Grade(reward=0.0, detail={"reference": task.answer, "match": task.match})


class SpecGraders:
    """Learner graders by SPEC, built once each and shared by the worker threads."""

    def __init__(self, build: Callable[[str], CombinedGrader] | None = None) -> None:
        self._build = build or (lambda spec: build_graders([spec]))
        self._graders: dict[str, CombinedGrader] = {}
        self._lock = threading.Lock()

    def grade(self, spec: str, trajectories: list[Trajectory], tasks: TaskTable) -> Grade:
        if not trajectories:
            return Grade.failed(f"grader {spec!r}: the run recorded no trajectory")
        with self._lock:  # graders need not be thread-safe (the judge keeps a client)
            if spec not in self._graders:
                self._graders[spec] = self._build(spec)
            (grade,) = self._graders[spec].grade([trajectories[-1]], tasks=tasks)
        return grade

    def close(self) -> None:
        for grader in self._graders.values():
            grader.close()


def grade_run(
    task: Task,
    *,
    tasks: TaskTable,
    default_grader: str | None,
    specs: SpecGraders,
    trajectories: list[Trajectory],
    stdout: str,
    check: Callable[[], Grade],
) -> Grade:
    """The grade of a run that ended normally (see the module docstring for the order)."""
    if task.check is not None:
        return check()
    spec = task.grader or default_grader
    if spec is not None:
        return specs.grade(spec, trajectories, tasks)
    if task.answer is not None:
        return grade_reference(task, trajectories=trajectories, stdout=stdout)
    return Grade.failed(f"task {task.key!r} has no check, grader or answer, and no --grader")
