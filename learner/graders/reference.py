"""The `reference` grader: the final answer against the task table's reference answer.

Reward 1.0 on a match, 0.0 otherwise; a trajectory without a reference is an error, never a
zero, so unknown tasks do not teach the model that everything is wrong. A transient one: the
task table may gain the task (`onthejob tasks load`, the admin API), and then it is graded.
"""

from __future__ import annotations

import re

from learner.graders.base import Grade
from learner.graders.extract import final_answer
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

# A number as people write it: sign, thousands separators, decimals, exponent.
_NUMBER = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_KEEP_CHARS = 500  # of the answer, in the detail: enough to see why, not a second copy


class ReferenceGrader:
    name = "reference"

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t, tasks) for t in trajectories]

    def _grade_one(self, trajectory: Trajectory, tasks: TaskTable) -> Grade:
        key = trajectory.task_key
        task = tasks.get(key) if key is not None else None
        if task is None or task.answer is None:
            return Grade.retry(f"no reference answer for task {key!r}")
        text = final_answer(trajectory)
        if text is None:
            return Grade.failed("the trajectory has no final answer (no successful reply)")
        matched, found = match(text, answer=task.answer, kind=task.match, tol=task.tolerance)
        detail = {"match": task.match, "expected": task.answer, "found": found}
        detail["answer_tail"] = text[-_KEEP_CHARS:]
        return Grade(reward=1.0 if matched else 0.0, detail=detail)


def match(text: str, *, answer: str, kind: str, tol: float) -> tuple[bool, str | None]:
    """(whether `text` matches the reference `answer`, the number or span that was compared)."""
    if kind == "numeric":
        return _numeric(text, float(answer), tol)
    if kind == "regex":
        found = re.search(answer, text)
        return found is not None, found.group(0) if found else None
    if kind == "contains":
        return answer.casefold() in text.casefold(), None
    return text.strip() == answer.strip(), None


def last_number(text: str) -> float | None:
    """The last number in the text: models tend to reason first and answer last."""
    numbers = _NUMBER.findall(text)
    return float(numbers[-1].replace(",", "")) if numbers else None


def _numeric(text: str, expected: float, tolerance: float) -> tuple[bool, str | None]:
    value = last_number(text)
    if value is None:
        return False, None
    return abs(value - expected) <= tolerance, repr(value)
