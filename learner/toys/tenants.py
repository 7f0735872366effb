"""Two tenants whose rewards conflict (bench/tenants.py), on the same prompts; two toys:

- `letter`: the tenant `more-a` is rewarded for the share of the letter 'a' in a reply,
  `fewer-a` for its absence (a full fine-tune of the tiny model learns it; a LoRA adapter
  on it does not);
- `case`: the tenant `lower` is rewarded when a reply begins low (a space or a lowercase
  ASCII letter), `not-lower` when it does not: about half the tiny model's first tokens
  each way, so a one-token reply carries a strong signal;
- `yesno`, for a real model: yes-or-no questions that have no one right answer; the tenant
  `yes` is rewarded for a reply that begins with yes, `no` for one that begins with no.

One shared policy cannot please both tenants of a toy. Each toy's prompts come in two
lists (`SPLITS`): the traffic trains on the first, and the bench measures on the second
alone, held out: no measured prompt is ever trained on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from learner.toys.letter import reply_text, share_of_a

MORE_A, FEWER_A = "more-a", "fewer-a"
LOWER, NOT_LOWER = "lower", "not-lower"
YES, NO = "yes", "no"
TOYS = {"letter": (MORE_A, FEWER_A), "case": (LOWER, NOT_LOWER), "yesno": (YES, NO)}
TENANTS = TOYS["letter"]
# the letter and case toys' prompts (the first: bench/learning_per_step.py's)
WRITE_PROMPTS = [f"Write something, take {i}." for i in range(8)]
WRITE_HELDOUT = [f"Write a few words, try {i}." for i in range(8)]
# questions a model may answer either way: which one pleases depends on the tenant
YESNO = "Answer with one word, yes or no. {}"
YESNO_PROMPTS = [
    YESNO.format(q)
    for q in (
        "Is a hot dog a sandwich?",
        "Is cereal a soup?",
        "Should pineapple go on pizza?",
        "Is a tomato a vegetable?",
        "Are cats better than dogs?",
        "Is winter the best season?",
        "Is a straw one hole or two?",
        "Should breakfast be the biggest meal?",
    )
]
YESNO_HELDOUT = [
    YESNO.format(q)
    for q in (
        "Is water wet?",
        "Is a burrito a sandwich?",
        "Should socks go with sandals?",
        "Is a peanut a nut?",
        "Is summer better than spring?",
        "Is a pop-tart a ravioli?",
        "Should you make your bed every day?",
        "Is chess a sport?",
    )
]
# per toy: (the prompts the traffic trains on, the held-out prompts it is measured on)
SPLITS = {
    "letter": (WRITE_PROMPTS, WRITE_HELDOUT),
    "case": (WRITE_PROMPTS, WRITE_HELDOUT),
    "yesno": (YESNO_PROMPTS, YESNO_HELDOUT),
}


def begins_with(word: str) -> Callable[[str], float]:
    def reward(text: str) -> float:
        head = text.strip().lower()
        return (
            1.0 if head.startswith(word) and not head[len(word) : len(word) + 1].isalpha() else 0.0
        )

    return reward


def begins_low(text: str) -> float:
    first = text[:1]
    return 1.0 if first == " " or (first.isascii() and first.islower()) else 0.0


REWARDS: dict[str, Callable[[str], float]] = {
    MORE_A: share_of_a,
    FEWER_A: lambda text: 1.0 - share_of_a(text),
    LOWER: begins_low,
    NOT_LOWER: lambda text: 1.0 - begins_low(text),
    YES: begins_with("yes"),
    NO: begins_with("no"),
}


def reward_for(tenant: str, text: str) -> float:
    return REWARDS[tenant](text)


def tenant_reward(trajectory: dict[str, Any]) -> float:
    """Python grader (python:learner.toys.tenants:tenant_reward): by the calls' client key, whose
    name is the tenant's."""
    key = trajectory["calls"][-1].get("key_name")
    if key not in REWARDS:
        raise ValueError(f"a call of no toy tenant (key {key!r})")
    return reward_for(key, reply_text(trajectory))
