"""What every grader returns and the interface the learner calls.

Invariant: a grader never raises for a bad trajectory; it returns one `Grade` per
trajectory, in order, and a failure is a Grade with `error` set. A failure is `transient`
when trying again later may succeed (an endpoint that timed out or was unreachable, a store
that was away, a task table that lacks the task yet): the learner grades it again, with
back-off. Any other failure is permanent: the trajectory is not trained on unless an
operator regrades it (`onthejob regrade`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from store.json_types import JsonObject

if TYPE_CHECKING:
    from store.tasks import TaskTable
    from store.trajectory_record import Trajectory


@dataclass(frozen=True)
class Grade:
    """A reward with the record that explains it (stored next to the reward)."""

    reward: float | None  # None when the grader could not grade (error, or waiting for feedback)
    detail: JsonObject = field(default_factory=dict)
    error: str | None = None  # the trajectory is skipped; the loop carries on
    pending: bool = False  # not gradable yet: ask again later
    transient: bool = False  # with `error`: trying again later may succeed

    @classmethod
    def failed(cls, error: str, **detail: Any) -> Grade:
        return cls(reward=None, detail=detail, error=error)

    @classmethod
    def retry(cls, error: str, **detail: Any) -> Grade:
        """A failure that may not happen again: grade it later."""
        return cls(reward=None, detail=detail, error=error, transient=True)

    @classmethod
    def of_exception(cls, error: str, exc: BaseException) -> Grade:
        return cls.retry(error) if is_transient(exc) else cls.failed(error)

    @classmethod
    def waiting(cls, **detail: Any) -> Grade:
        return cls(reward=None, detail=detail, pending=True)


class Grader(Protocol):
    name: str

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        """One Grade per trajectory, same order. Graders that compare trajectories with each
        other (the judge) treat the list as a group: pass trajectories of one task together."""
        ...


class TransientGradingError(Exception):
    """Raise it from a python: grader to say "not now, try again later"."""


def is_transient(exc: BaseException) -> bool:
    """Whether an exception a grader met says nothing about the trajectory: the network,
    a timeout, a server that was away or overloaded."""
    import httpx
    import openai
    from sqlalchemy.exc import InterfaceError, OperationalError

    return isinstance(
        exc,
        TransientGradingError
        | ConnectionError
        | TimeoutError
        | httpx.TransportError
        | openai.APIConnectionError
        | openai.RateLimitError
        | openai.InternalServerError
        | OperationalError  # a store that is away (the feedback grader reads it)
        | InterfaceError,
    )


def as_reward(value: object) -> float:
    """A user-supplied reward as a float: numbers and bools (True -> 1.0); a NaN or infinity
    is refused because one bad reward would poison a whole training step."""
    if not isinstance(value, numbers.Real):
        raise ValueError(f"expected a number, got {type(value).__name__}: {value!r:.200}")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"expected a finite number, got {reward!r}")
    return reward
