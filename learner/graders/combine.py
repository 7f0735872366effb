"""Grader specs (`--grader SPEC[@WEIGHT]`) and their weighted combination.

SPEC is `reference`, `next_turn[:judge]`, `python:MODULE:FUNCTION`, `command:SHELL_COMMAND`,
`judge[:BASE_URL]` or `feedback`. Invariant: a trajectory gets a reward only when every
component graded it; any component error makes it an error (skipped; transient only if every
error is), else any pending component makes it pending.
"""

from __future__ import annotations

from collections.abc import Sequence

from learner.graders.base import Grade, Grader
from learner.graders.command import CommandGrader
from learner.graders.feedback import FeedbackGrader, FeedbackSource
from learner.graders.judge import JudgeGrader
from learner.graders.judge_prompt import DEFAULT_RUBRIC
from learner.graders.next_turn import NextTurnGrader
from learner.graders.python import PythonGrader
from learner.graders.reference import ReferenceGrader
from learner.graders.turn_judge import TurnJudge
from learner.signals import SignalWeights
from store.grader_specs import FORMS, ORDER, parse_spec
from store.json_types import JsonObject
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

__all__ = ["CombinedGrader", "build_graders", "parse_spec"]


def build_graders(
    specs: Sequence[str],
    *,
    judge_base_url: str | None = None,
    judge_model: str | None = None,
    judge_rubric: str = DEFAULT_RUBRIC,
    feedback_source: FeedbackSource | None = None,
    feedback_wait_seconds: float = 3600.0,
    command_timeout: float = 30.0,
    signal_weights: SignalWeights | None = None,
) -> CombinedGrader:
    """The graders named by `specs`, combined; ValueError for a bad or duplicated spec."""
    if not specs:
        raise ValueError(f"no grader given; expected one or more of {FORMS}")
    components: list[tuple[int, Grader, float]] = []
    for spec in specs:
        kind, arg, weight = parse_spec(spec)
        grader = _build_one(
            kind,
            arg,
            judge_base_url=judge_base_url,
            judge_model=judge_model,
            judge_rubric=judge_rubric,
            feedback_source=feedback_source,
            feedback_wait_seconds=feedback_wait_seconds,
            command_timeout=command_timeout,
            signal_weights=signal_weights,
        )
        if any(grader.name == other.name for _, other, _ in components):
            raise ValueError(f"grader spec {spec!r}: {grader.name!r} is given twice")
        components.append((ORDER[kind], grader, weight))
    components.sort(key=lambda item: item[0])
    return CombinedGrader([(grader, weight) for _, grader, weight in components])


def _build_one(
    kind: str,
    arg: str | None,
    *,
    judge_base_url: str | None,
    judge_model: str | None,
    judge_rubric: str,
    feedback_source: FeedbackSource | None,
    feedback_wait_seconds: float,
    command_timeout: float,
    signal_weights: SignalWeights | None,
) -> Grader:
    if kind == "reference":
        return ReferenceGrader()
    if kind == "next_turn":
        if arg is None:
            return NextTurnGrader(signal_weights)
        if judge_base_url is None:
            raise ValueError("grader spec 'next_turn:judge': no judge base URL is configured")
        return NextTurnGrader(signal_weights, TurnJudge(judge_base_url, model=judge_model))
    if kind == "python":
        return PythonGrader(arg or "")
    if kind == "command":
        return CommandGrader(arg or "", timeout=command_timeout)
    if kind == "judge":
        base_url = arg or judge_base_url
        if base_url is None:
            raise ValueError("grader spec 'judge': no judge base URL; use judge:BASE_URL")
        name = f"judge:{arg}" if arg else "judge"
        return JudgeGrader(base_url, model=judge_model, rubric=judge_rubric, name=name)
    if feedback_source is None:
        raise ValueError("grader spec 'feedback': no feedback source is configured")
    return FeedbackGrader(feedback_source, wait_seconds=feedback_wait_seconds)


class CombinedGrader:
    """The weighted mean of its components' rewards (weights normalised over the components)."""

    def __init__(self, components: Sequence[tuple[Grader, float]]) -> None:
        if not components or any(weight <= 0 for _, weight in components):
            raise ValueError("a combined grader needs components with positive weights")
        self.components = list(components)
        self.name = " + ".join(f"{grader.name}@{weight:g}" for grader, weight in self.components)

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        results = [_Partial() for _ in trajectories]
        alive = list(range(len(trajectories)))
        for grader, weight in self.components:
            if not alive:
                break
            grades = _grade_safely(grader, [trajectories[i] for i in alive], tasks)
            for index, grade in zip(alive, grades, strict=True):
                results[index].add(grader.name, weight, grade)
            alive = [i for i in alive if results[i].still_gradable]
        return [result.grade() for result in results]

    def close(self) -> None:
        for grader, _ in self.components:
            close = getattr(grader, "close", None)
            if callable(close):
                close()


class _Partial:
    """One trajectory's grades so far."""

    def __init__(self) -> None:
        self.detail: JsonObject = {}
        self.errors: list[str] = []
        self.permanent = False  # some error will not go away by trying again
        self.pending = False
        self.weighted: list[tuple[float, float]] = []  # (weight, reward)

    @property
    def still_gradable(self) -> bool:
        return not self.errors and not self.pending

    def add(self, name: str, weight: float, grade: Grade) -> None:
        entry: JsonObject = {"reward": grade.reward, "weight": weight, "detail": grade.detail}
        if grade.error is not None:
            entry["error"] = grade.error
            self.errors.append(f"{name}: {grade.error}")
            self.permanent |= not grade.transient
        elif grade.pending:
            entry["pending"] = True
            self.pending = True
        elif grade.reward is None:
            self.errors.append(f"{name}: gave neither a reward nor an error")
        else:
            self.weighted.append((weight, grade.reward))
        self.detail[name] = entry

    def grade(self) -> Grade:
        if self.errors:
            error = "; ".join(self.errors)
            return Grade(None, self.detail, error=error, transient=not self.permanent)
        if self.pending:
            return Grade(reward=None, detail=self.detail, pending=True)
        total = sum(weight for weight, _ in self.weighted)
        reward = sum(weight * reward for weight, reward in self.weighted) / total
        return Grade(reward=reward, detail=self.detail)


def _grade_safely(grader: Grader, batch: list[Trajectory], tasks: TaskTable) -> list[Grade]:
    """A grader that breaks its promise (raises, or miscounts) fails this batch, not the loop."""
    try:
        grades = grader.grade(batch, tasks=tasks)
    except Exception as exc:
        return [Grade.of_exception(f"{type(exc).__name__}: {exc}", exc)] * len(batch)
    if len(grades) != len(batch):
        return [Grade.failed(f"returned {len(grades)} grades for {len(batch)}")] * len(batch)
    return grades
