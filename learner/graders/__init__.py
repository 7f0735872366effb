"""Graders: turn finished trajectories (in the export format) into rewards.

Build them from `--grader` specs with `build_graders`; every grader returns one `Grade`
per trajectory and reports failures inside the Grade instead of raising.
"""

from learner.graders.base import Grade, Grader
from learner.graders.combine import CombinedGrader, build_graders, parse_spec
from learner.graders.feedback import FeedbackSource
from store.tasks import Task, TaskTable, TaskTableError

__all__ = [
    "CombinedGrader",
    "FeedbackSource",
    "Grade",
    "Grader",
    "Task",
    "TaskTable",
    "TaskTableError",
    "build_graders",
    "parse_spec",
]
