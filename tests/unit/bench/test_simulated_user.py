"""The simulated user's own, noisy judgement and its words (bench/simulated_user.py)."""

from __future__ import annotations

import random

import pytest

from bench.simulated_user import (
    ACKNOWLEDGEMENTS,
    CERTAIN,
    CORRECTIONS,
    expected_answer,
    looks_right,
    user_reply,
    user_rng,
)
from learner.demo.reading_tasks import answer_pattern
from store.next_turn import user_verdict

CALC = {"id": "train-0001", "prompt": "What is 13 plus 8?", "answer": "21"}
READING = {
    "id": "train-0002",
    "prompt": "Ann flew from Oslo to Rome last week. Which city did Ann fly to?",
    "answer": answer_pattern("Rome", "Oslo"),
    "match": "regex",
    "metadata": {"expected": "Rome", "distractor": "Oslo"},
}


def test_only_the_first_phrasings_of_each_pool_are_certain_to_the_rules() -> None:
    assert [user_verdict(t) for t in CORRECTIONS[:CERTAIN]] == [-1.0] * CERTAIN
    assert [user_verdict(t) for t in ACKNOWLEDGEMENTS[:CERTAIN]] == [1.0] * CERTAIN
    assert [user_verdict(t) for t in CORRECTIONS[CERTAIN:] + ACKNOWLEDGEMENTS[CERTAIN:]] == [
        None
    ] * (len(CORRECTIONS) + len(ACKNOWLEDGEMENTS) - 2 * CERTAIN)


@pytest.mark.parametrize("said", CORRECTIONS + ACKNOWLEDGEMENTS)
def test_no_phrasing_gives_the_answer_away(said: str) -> None:
    assert not any(ch.isdigit() for ch in said)
    assert "{" not in said


@pytest.mark.parametrize(
    ("reply", "right"),
    [
        ("21", True),
        ("The answer is 21.", True),
        ("21 or 22", True),  # a hurried reader: the reference grader's exact match says no
        ("211", False),
        ("2.21", False),
        ("21.5", False),
        ("", False),
    ],
)
def test_the_user_reads_the_expected_number_as_a_word_of_its_own(reply: str, right: bool) -> None:
    assert looks_right(reply, expected_answer(CALC)) is right


def test_a_reading_task_is_judged_by_its_plain_answer_not_the_reference_pattern() -> None:
    assert expected_answer(READING) == "Rome"
    assert looks_right("rome", "Rome")
    # names the distractor too: the reference pattern refuses it, the user does not
    assert looks_right("Oslo, then Rome", "Rome")


def verdicts(task: dict, reply: str, *, noise: float, silent: float, n: int = 4000) -> list:
    rng = random.Random(1)
    return [user_reply(reply, task, rng=rng, noise=noise, silent=silent) for _ in range(n)]


def test_without_noise_the_user_always_judges_by_its_reading() -> None:
    assert all(said in ACKNOWLEDGEMENTS for said in verdicts(CALC, "21", noise=0, silent=0))
    assert all(said in CORRECTIONS for said in verdicts(CALC, "22", noise=0, silent=0))


def test_noise_flips_that_share_of_verdicts_and_silent_users_say_nothing() -> None:
    said = verdicts(CALC, "21", noise=0.15, silent=0.1)
    silent = sum(s is None for s in said) / len(said)
    spoken = [s for s in said if s is not None]
    wrong = sum(s in CORRECTIONS for s in spoken) / len(spoken)
    assert 0.08 <= silent <= 0.12
    assert 0.12 <= wrong <= 0.18


def test_the_draws_are_seeded_by_the_seed_the_task_and_the_answer() -> None:
    def draws(seed: int, reply: str) -> list:
        rng = user_rng(seed, CALC, reply)
        return [rng.random() for _ in range(3)]

    assert draws(3, "21") == draws(3, "21")
    assert draws(3, "21") != draws(4, "21")
    assert draws(3, "21") != draws(3, "22")
