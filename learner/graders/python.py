"""The `python:MODULE:FUNCTION` grader: a user's callable, the trajectory in the export
format (a dict, store/export.py `to_export`: a public interface) in, a number out.

The callable is imported once, when the grader is built, so a typo fails the start instead
of every trajectory; whatever it raises or returns is caught and becomes an error Grade
(transient for network errors, timeouts and learner.graders.base.TransientGradingError).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

from learner.graders.base import Grade, as_reward
from store.export import to_export
from store.json_types import JsonObject
from store.tasks import TaskTable
from store.trajectory_record import Trajectory


class PythonGrader:
    def __init__(self, target: str) -> None:
        self.name = f"python:{target}"
        self.function = load_callable(target)

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        return [self._grade_one(t) for t in trajectories]

    def _grade_one(self, trajectory: Trajectory) -> Grade:
        try:
            # A copy, so a callable that edits its argument (the request and response bodies
            # are the record's own) cannot change what others see.
            value = self.function(copy.deepcopy(to_export(trajectory)))
            return Grade(reward=as_reward(value), detail={})
        except (Exception, SystemExit) as exc:  # a stray sys.exit() must not end the learner
            return Grade.of_exception(f"{self.name} failed: {type(exc).__name__}: {exc}", exc)


def load_callable(target: str) -> Callable[[JsonObject], Any]:
    """`package.module:function` (or `module:Class.method`) -> the callable; ValueError if not."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"python grader {target!r}: expected MODULE:FUNCTION")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:  # a broken module can raise anything at import
        raise ValueError(f"python grader {target!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"python grader {target!r}: {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"python grader {target!r}: {attribute!r} is not callable")
    return found
