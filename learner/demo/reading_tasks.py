"""The real-model demo's task set: short reading questions with a distractor (seeded).

Two kinds, both answered in one reply and graded against a reference:
- ``destination``: "Anna flew from Paris to Rome last week. Which city did Anna fly to?"
  (the answer names Rome and not Paris);
- ``sentiment``: 'Review: "The movie was awful." Is this review positive or negative?'
  (the answer says negative and not positive).

A reply is right when it names the answer and not the distractor, so a hedge ("from Paris
to Rome") or a reply that lists both labels is wrong. The reference is a regular expression
for the `reference` grader's ``regex`` match (learner/graders/reference.py), so the learner
grades these tasks with no code of the demo's.

Why these: on SmolLM2-135M-Instruct (dequantized from Q4_1, docs/real-models.md) they
start inside the band where learning can show: at temperature 1 and 32 new tokens, 17% of
destination and 21% of sentiment replies were right (48 each), most of the others rambling
past the answer or naming both. The train and held-out splits share no prompt, and the
held-out split also uses names and cities the train split never shows.
"""

from __future__ import annotations

import random
import re

from learner.demo.tasks import DemoTask

_CITIES = [
    *("Paris", "Rome", "Berlin", "Madrid", "London", "Vienna", "Prague", "Lisbon", "Dublin"),
    *("Oslo", "Athens", "Warsaw", "Cairo", "Tokyo", "Boston", "Chicago", "Sydney", "Toronto"),
    *("Lima", "Seoul", "Delhi", "Nairobi", "Denver", "Munich"),
]
_NAMES = [
    *("Anna", "Tom", "Maria", "James", "Sofia", "Liam", "Emma", "Noah", "Olivia", "Lucas"),
    *("Mia", "Ben", "Zoe", "Omar", "Lena", "Ivan"),
]
_GOOD = ["great", "wonderful", "excellent", "lovely", "fantastic", "superb"]
_BAD = ["terrible", "awful", "boring", "horrible", "dreadful", "disappointing"]
_THINGS = ["movie", "meal", "hotel", "book", "concert", "game", "trip", "show"]
_REVIEWS = ["The {thing} was {word}.", "I found the {thing} {word}.", "What a {word} {thing}!"]
# a sixth of the names and cities appear in held-out prompts only
_HELDOUT_ONLY = 6


def answer_pattern(answer: str, distractor: str) -> str:
    """A regex (for re.search) that matches a reply naming `answer` and not `distractor`."""
    return rf"(?is)^(?!.*\b{re.escape(distractor)}\b).*\b{re.escape(answer)}\b"


def _destination(rng: random.Random, cities: list[str], names: list[str]) -> DemoTask:
    origin, goal = rng.sample(cities, 2)
    name = rng.choice(names)
    return {
        "prompt": f"{name} flew from {origin} to {goal} last week. Which city did {name} fly to?",
        "answer": answer_pattern(goal, origin),
        "metadata": {"kind": "destination", "expected": goal, "distractor": origin},
    }


def _sentiment(rng: random.Random) -> DemoTask:
    good = rng.random() < 0.5
    word = rng.choice(_GOOD if good else _BAD)
    label, other = ("positive", "negative") if good else ("negative", "positive")
    review = rng.choice(_REVIEWS).format(thing=rng.choice(_THINGS), word=word)
    return {
        "prompt": f'Review: "{review}" Is this review positive or negative?',
        "answer": answer_pattern(label, other),
        "metadata": {"kind": "sentiment", "expected": label, "distractor": other},
    }


def make_reading_tasks(
    seed: int, n_train: int, n_heldout: int
) -> tuple[list[DemoTask], list[DemoTask]]:
    """(train, held-out) task rows, half of each kind, no prompt in both splits."""
    rng = random.Random(seed)
    cities, names = _CITIES[:], _NAMES[:]
    rng.shuffle(cities)
    rng.shuffle(names)
    split_cities = {"train": cities[_HELDOUT_ONLY:], "heldout": cities}
    split_names = {"train": names[_HELDOUT_ONLY:], "heldout": names}
    seen: set[str] = set()
    splits: dict[str, list[DemoTask]] = {"train": [], "heldout": []}
    for split, count in (("heldout", n_heldout), ("train", n_train)):
        rows = splits[split]
        tries = 0
        while len(rows) < count:
            tries += 1
            if tries > 100 * (count + 1):
                raise ValueError(f"cannot draw {count} distinct {split} tasks")
            if len(rows) % 2 == 0:
                row = _destination(rng, split_cities[split], split_names[split])
            else:
                row = _sentiment(rng)
            if row["prompt"] in seen:
                continue
            seen.add(row["prompt"])
            row["metadata"]["split"] = split
            rows.append({"id": f"{split}-{len(rows):04d}", "match": "regex", **row})
    return splits["train"], splits["heldout"]
