"""store.tokens: full prompts rebuilt from parent-relative deltas."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from store.tokens import common_prefix_len, first_completion, materialize_prompts


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([], [1], 0),
        ([5], [6], 0),
        ([1, 2, 3], [1, 2, 4], 2),
        ([1, 2], [1, 2, 3], 2),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2, 3], [1, 2, 3], 3),
        ((1, 9, 3), [1, 2, 3], 1),
    ],
)
def test_common_prefix_len(a: Any, b: Any, expected: int) -> None:
    assert common_prefix_len(a, b) == expected


def test_first_completion_is_the_first_choices_tokens() -> None:
    assert first_completion(None) == []
    assert first_completion([]) == []
    assert first_completion([{"token_ids": None}]) == []
    assert first_completion([{"token_ids": [4, 5]}, {"token_ids": [6]}]) == [4, 5]


def _row(
    call_id: str,
    suffix: list[int] | None,
    completion: list[int] | None = None,
    parent: str | None = None,
    prefix_len: int = 0,
) -> dict[str, Any]:
    return {
        "id": call_id,
        "prompt_parent_id": parent,
        "prompt_prefix_len": prefix_len,
        "prompt_token_suffix": suffix,
        "choices": None if completion is None else [{"token_ids": completion}],
    }


# a: prompt [1,2,3] -> [4,5]; b extends a's whole sequence; c extends b's;
# d's template re-renders c's last completion token (12 -> 13), so it shares 11 tokens
CHAIN = [
    _row("a", [1, 2, 3], [4, 5]),
    _row("b", [6, 7], [8, 9], parent="a", prefix_len=5),
    _row("c", [10], [11, 12], parent="b", prefix_len=9),
    _row("d", [13, 14], [15], parent="c", prefix_len=11),
]
EXPECTED = {
    "a": [1, 2, 3],
    "b": [1, 2, 3, 4, 5, 6, 7],
    "c": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    "d": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14],
}


def test_chain_of_calls() -> None:
    assert materialize_prompts(CHAIN) == EXPECTED


def test_partial_prefix_inside_the_parents_prompt() -> None:
    # the template rendered a's prompt differently from token 3 on
    calls = [CHAIN[0], _row("b", [7, 7], parent="a", prefix_len=2)]

    assert materialize_prompts(calls) == {"a": [1, 2, 3], "b": [1, 2, 7, 7]}


def test_calls_without_captured_tokens_are_none() -> None:
    calls = [
        _row("a", None),
        _row("b", [1, 2], [3]),
        _row("c", None),
        _row("d", [4], parent="b", prefix_len=3),
    ]

    assert materialize_prompts(calls) == {"a": None, "b": [1, 2], "c": None, "d": [1, 2, 3, 4]}


def test_no_prefix_means_no_parent_lookup() -> None:
    def fetch_calls(ids: list[str]) -> dict[str, Any]:
        raise AssertionError(f"looked up {ids}")

    calls = [_row("b", [9], parent="gone", prefix_len=0)]

    assert materialize_prompts(calls, fetch_calls) == {"b": [9]}


def test_parents_outside_the_list_are_fetched_in_one_batch_per_generation() -> None:
    stored = {row["id"]: row for row in CHAIN}
    asked: list[list[str]] = []

    def fetch_calls(ids: list[str]) -> dict[str, Any]:
        asked.append(ids)
        return {i: stored[i] for i in ids if i in stored}

    prompts = materialize_prompts([CHAIN[2], CHAIN[3]], fetch_calls)

    assert prompts == {"c": EXPECTED["c"], "d": EXPECTED["d"]}
    assert asked == [["b"], ["a"]]


def test_a_missing_parent_makes_its_line_unknowable_and_nothing_else() -> None:
    # b's parent a was refused by the database: b, and c and d built on it, cannot be
    # rebuilt; another conversation in the same batch is untouched
    other = [_row("x", [7, 7], [8]), _row("y", [9], parent="x", prefix_len=3)]
    prompts = materialize_prompts([*CHAIN[1:], *other], lambda ids: {})

    assert prompts == {"b": None, "c": None, "d": None, "x": [7, 7], "y": [7, 7, 8, 9]}
    assert materialize_prompts([CHAIN[1]]) == {"b": None}  # nothing to fetch with, either


def test_a_parent_shorter_than_the_prefix_it_should_hold_is_unknowable() -> None:
    calls = [CHAIN[0], _row("b", [6], parent="a", prefix_len=9)]  # a's sequence has 5

    assert materialize_prompts(calls) == {"a": [1, 2, 3], "b": None}


def _encode(turns: list[tuple[list[int], list[int]]]) -> list[dict[str, Any]]:
    """Store (prompt, completion) turns the way the recorder does."""
    rows: list[dict[str, Any]] = []
    last: list[int] = []
    for number, (prompt, completion) in enumerate(turns):
        prefix = common_prefix_len(last, prompt) if rows else 0
        parent = rows[-1]["id"] if prefix else None
        rows.append(_row(f"call{number}", prompt[prefix:], completion, parent, prefix))
        last = prompt + completion
    return rows


def test_materialize_inverts_the_recorders_encoding() -> None:
    turns = [
        ([1, 2, 3], [4, 5, 6]),
        ([1, 2, 3, 4, 5, 6, 7], [8]),  # extends everything
        ([1, 2, 3, 4, 5, 9], [10, 11]),  # re-rendered: shares 5 tokens
        ([20, 21], [22]),  # unrelated: no parent
        ([20, 21, 22, 23], [24]),
    ]

    rows = _encode(turns)

    assert [r["prompt_prefix_len"] for r in rows] == [0, 6, 5, 0, 3]
    assert materialize_prompts(rows) == {f"call{i}": t[0] for i, t in enumerate(turns)}


def test_a_session_far_longer_than_the_recursion_limit() -> None:
    # each turn extends the whole conversation: rebuilt with a loop, not one frame per call
    turns = [([*range(n), 50_000 + n], [60_000 + n]) for n in range(1500)]
    for n in range(1, len(turns)):
        previous = turns[n - 1][0] + turns[n - 1][1]
        turns[n] = ([*previous, 50_000 + n], turns[n][1])
    rows = _encode(turns)

    assert materialize_prompts(rows) == {f"call{i}": t[0] for i, t in enumerate(turns)}


def _naive_prefix(a: list[int], b: list[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


@pytest.mark.parametrize("differs_at", [0, 1, 255, 256, 257, 511, 777, 999, None])
def test_common_prefix_len_of_long_token_arrays(differs_at: int | None) -> None:
    base = list(range(100_000, 101_000))
    other = list(base)
    if differs_at is not None:
        other[differs_at] = -1
    for a, b in ((base, other), (base, other[:600]), (base[:300], other)):
        expected = _naive_prefix(a, b)
        assert common_prefix_len(array("q", a), array("q", b)) == expected
        assert common_prefix_len(a, b) == expected
