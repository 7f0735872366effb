"""learner.graders.base: Grade constructors and reward coercion."""

from __future__ import annotations

from fractions import Fraction

import pytest

from learner.graders.base import Grade, as_reward


def test_grade_constructors() -> None:
    assert Grade.failed("boom", seen=1) == Grade(reward=None, detail={"seen": 1}, error="boom")
    assert Grade.waiting() == Grade(reward=None, detail={}, pending=True)


@pytest.mark.parametrize(
    ("value", "reward"), [(1, 1.0), (0.25, 0.25), (True, 1.0), (False, 0.0), (Fraction(1, 4), 0.25)]
)
def test_numbers_and_bools_are_rewards(value: object, reward: float) -> None:
    assert as_reward(value) == reward and type(as_reward(value)) is float


@pytest.mark.parametrize("value", ["1", None, [1], float("nan"), float("inf"), complex(1, 0)])
def test_everything_else_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="expected a"):
        as_reward(value)
