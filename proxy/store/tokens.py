"""Rebuild full prompt token sequences from the stored deltas.

A call stores `prompt_prefix_len` tokens by reference to its parent call's full sequence
(the parent's prompt followed by its first choice's completion) and only the rest in
`prompt_token_suffix`, so a multi-turn trace costs linear, not quadratic, space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by slice comparisons (C speed): a multi-turn
    prompt usually extends the previous sequence whole, which one comparison confirms;
    otherwise a binary search over prefix lengths. A loop over tokens in Python costs
    about 50 us per thousand tokens."""
    if type(a) is not type(b):  # slices of a tuple and a list never compare equal
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n - 1  # the prefix of length `low` agrees, that of length n does not
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def first_completion(choices: Any) -> list[int]:
    if not choices:
        return []
    return list(choices[0].get("token_ids") or [])


def materialize_prompts(
    calls: Sequence[dict[str, Any]],
    fetch_call: Callable[[str], dict[str, Any] | None] | None = None,
) -> dict[str, list[int] | None]:
    """Full prompt token ids for each call (by id); None where no tokens were captured.

    `calls` are rows in order; a parent outside them is looked up with `fetch_call`.
    """
    prompts: dict[str, list[int] | None] = {}
    by_id = {c["id"]: c for c in calls}

    def prompt_of(call: dict[str, Any]) -> list[int] | None:
        if call["id"] in prompts:
            return prompts[call["id"]]
        suffix = call.get("prompt_token_suffix")
        if suffix is None:
            prompts[call["id"]] = None
            return None
        prefix: list[int] = []
        parent_id = call.get("prompt_parent_id")
        if parent_id and call.get("prompt_prefix_len"):
            parent = by_id.get(parent_id) or (fetch_call(parent_id) if fetch_call else None)
            if parent is None:
                raise LookupError(f"call {call['id']}: parent call {parent_id} not found")
            by_id[parent_id] = parent
            parent_prompt = prompt_of(parent) or []
            full = parent_prompt + first_completion(parent.get("choices"))
            prefix = full[: call["prompt_prefix_len"]]
        prompts[call["id"]] = prefix + list(suffix)
        return prompts[call["id"]]

    for call in calls:
        prompt_of(call)
    return {c["id"]: prompts[c["id"]] for c in calls}
