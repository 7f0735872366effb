"""The task families of the defaults bench (bench/defaults_learn.py): one kind of question
each, in seeded train and held-out splits that share no prompt, every task graded by the
`reference` grader's ``regex`` match (learner/graders/reference.py).

- ``sentiment``, ``destination``: the demo's reading questions (learner/demo/reading_tasks.py),
  one kind each; the learner's defaults were chosen on these.
- ``arithmetic``: one-digit sums ("What is 3 + 5? Answer with the number."), KEPT OUT of the
  tuning (docs/measurements/defaults.md). A reply is right when it names the sum as a whole
  number and no number other than the sum and the two operands: "8", "3 + 5 = 8" are right;
  "18", "8.5", "7 or 8" and a reply rambling on into other sums are wrong, as the reading
  questions count a reply that names the distractor wrong. The held-out split asks pairs
  (a, b) that the train split never asks.
"""

from __future__ import annotations

import random
from typing import Any

from learner.demo.reading_tasks import make_reading_tasks

_TEMPLATES = (
    "What is {a} + {b}? Answer with the number.",
    "Add {a} and {b}. Answer with the number.",
    "{a} + {b} = ? Answer with the number.",
)
_HELDOUT_PAIRS = 20  # of the 100 ordered pairs, asked by held-out prompts only
# a number starts where no digit or decimal point is just before it, and is whole where no
# digit (or decimal point and digit) follows
_START = r"(?<![\d.])"
_END = r"(?!\.?\d)"

Tasks = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def sum_pattern(a: int, b: int) -> str:
    """A regex (for re.search) matching a reply that names a + b as a whole number and no
    number besides a, b and a + b."""
    total = a + b
    # longest first, so that "18" is tried before "1" or "8"
    allowed = "|".join(sorted({str(a), str(b), str(total)}, key=len, reverse=True))
    other_number = rf"{_START}(?!(?:{allowed}){_END})\d"
    return rf"(?s)^(?!.*{other_number}).*{_START}{total}{_END}"


def make_arithmetic_tasks(seed: int, n_train: int, n_heldout: int) -> Tasks:
    """(train, held-out) one-digit sums; the splits ask disjoint (a, b) pairs."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    by_split = {"heldout": pairs[:_HELDOUT_PAIRS], "train": pairs[_HELDOUT_PAIRS:]}
    counts = {"heldout": n_heldout, "train": n_train}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, split_pairs in by_split.items():
        drawn = [(a, b, t) for a, b in split_pairs for t in _TEMPLATES]
        if counts[split] > len(drawn):
            raise ValueError(f"only {len(drawn)} distinct {split} sums, {counts[split]} asked")
        rng.shuffle(drawn)
        splits[split] = [
            {
                "id": f"{split}-{i:04d}",
                "match": "regex",
                "prompt": template.format(a=a, b=b),
                "answer": sum_pattern(a, b),
                "metadata": {
                    "kind": "arithmetic",
                    "operands": [a, b],
                    "expected": str(a + b),
                    "split": split,
                },
            }
            for i, (a, b, template) in enumerate(drawn[: counts[split]])
        ]
    return splits["train"], splits["heldout"]


def _reading_kind(kind: str, seed: int, n_train: int, n_heldout: int) -> Tasks:
    """One kind of the reading questions: the demo draws both kinds in turn, so a draw of
    twice as many holds exactly as many of each."""
    train, heldout = make_reading_tasks(seed, 2 * n_train, 2 * n_heldout)
    return (
        [t for t in train if t["metadata"]["kind"] == kind],
        [t for t in heldout if t["metadata"]["kind"] == kind],
    )


FAMILIES = ("sentiment", "destination", "arithmetic")


def make_family_tasks(family: str, seed: int, n_train: int, n_heldout: int) -> Tasks:
    """(train, held-out) task rows of one family (FAMILIES), in the task-file format."""
    if family == "arithmetic":
        return make_arithmetic_tasks(seed, n_train, n_heldout)
    if family in FAMILIES:
        return _reading_kind(family, seed, n_train, n_heldout)
    raise ValueError(f"unknown task family {family!r} ({', '.join(FAMILIES)})")
