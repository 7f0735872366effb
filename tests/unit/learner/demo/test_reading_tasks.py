"""The real-model demo's reading tasks: disjoint splits, both kinds, and a reference that
takes the answer only when the distractor is not named too."""

from __future__ import annotations

import re

import pytest

from learner.demo.reading_tasks import answer_pattern, make_reading_tasks
from learner.graders.reference import match


def test_splits_share_no_prompt_and_hold_both_kinds() -> None:
    train, heldout = make_reading_tasks(0, 200, 60)
    assert len(train) == 200 and len(heldout) == 60
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in heldout}
    for split in (train, heldout):
        kinds = [t["metadata"]["kind"] for t in split]
        assert kinds.count("destination") == kinds.count("sentiment")


def test_the_same_seed_draws_the_same_tasks_and_another_seed_others() -> None:
    assert make_reading_tasks(3, 20, 10) == make_reading_tasks(3, 20, 10)
    assert make_reading_tasks(3, 20, 10) != make_reading_tasks(4, 20, 10)


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ("Rome", True),
        ("She flew to Rome.", True),
        ("rome", True),
        ("From Paris to Rome.", False),
        ("Paris", False),
        ("Romeo", False),
        ("", False),
    ],
)
def test_the_reference_names_the_answer_and_not_the_distractor(reply: str, right: bool) -> None:
    pattern = answer_pattern("Rome", "Paris")
    assert match(reply, answer=pattern, kind="regex", tol=0.0)[0] is right
    assert bool(re.search(pattern, reply)) is right
