"""`onthejob learn`'s loop: the Learner (learner.py, the orchestrator) and its parts."""

from learner.loop.learner import Learner
from learner.loop.state import PROBE_TEXT, RestoreFailed
from learner.loop.weights import expected_for

__all__ = ["PROBE_TEXT", "Learner", "RestoreFailed", "expected_for"]
