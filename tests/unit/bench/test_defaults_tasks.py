"""The defaults bench's task families: one kind each, disjoint seeded splits, and the
arithmetic reference that takes the sum only as a whole number and beside no other number."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.defaults_tasks import FAMILIES, make_arithmetic_tasks, make_family_tasks, sum_pattern
from learner.graders.reference import match
from store.tasks import TaskTable


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ("8", True),
        ("The answer is 8.", True),
        ("3 + 5 = 8", True),  # the operands may be named again
        ("5+3=8, so 8", True),
        ("18", False),  # "8" inside another number is not the sum
        ("88", False),
        ("8.5", False),
        ("0.8", False),
        ("7 or 8", False),  # a hedge names another number
        ("8\nQ: What is 4 + 2?\nA: 6", False),  # rambling into other sums
        ("eight", False),
        ("", False),
    ],
)
def test_the_sum_counts_only_whole_and_alone(reply: str, right: bool) -> None:
    assert match(reply, answer=sum_pattern(3, 5), kind="regex", tol=0.0)[0] is right


def test_a_two_digit_sum_is_not_its_digits() -> None:
    pattern = sum_pattern(9, 9)
    assert match("9 + 9 = 18", answer=pattern, kind="regex", tol=0.0)[0]
    assert not match("1 8", answer=pattern, kind="regex", tol=0.0)[0]
    assert not match("17", answer=sum_pattern(3, 4), kind="regex", tol=0.0)[0]


def test_arithmetic_splits_ask_disjoint_pairs_and_are_seeded() -> None:
    train, heldout = make_arithmetic_tasks(3, 240, 60)  # every sum there is
    assert len(train) == 240 and len(heldout) == 60
    assert len({t["prompt"] for t in train + heldout}) == 300
    pairs = {split: {tuple(t["metadata"]["operands"]) for t in split_tasks}
             for split, split_tasks in (("train", train), ("heldout", heldout))}  # fmt: skip
    assert len(pairs["heldout"]) == 20 and not pairs["train"] & pairs["heldout"]
    assert make_arithmetic_tasks(3, 20, 10) == make_arithmetic_tasks(3, 20, 10)
    assert make_arithmetic_tasks(3, 20, 10) != make_arithmetic_tasks(4, 20, 10)
    with pytest.raises(ValueError):
        make_arithmetic_tasks(3, 241, 10)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_one_kind_in_disjoint_splits_the_learner_can_load(
    family: str, tmp_path: Path
) -> None:
    from learner.demo.tasks import write_jsonl

    train, heldout = make_family_tasks(family, 4, 64, 32)
    assert len(train) == 64 and len(heldout) == 32
    assert {t["metadata"]["kind"] for t in train + heldout} == {family}
    assert not {t["prompt"] for t in train} & {t["prompt"] for t in heldout}
    table = TaskTable.from_jsonl(write_jsonl(train + heldout, tmp_path / "tasks.jsonl"))
    assert len(table) == 96 and all(task.match == "regex" for task in table.values())


def test_an_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown task family"):
        make_family_tasks("poetry", 3, 4, 4)
