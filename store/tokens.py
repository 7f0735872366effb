"""Rebuild full prompt token sequences from the stored deltas.

A call stores `prompt_prefix_len` tokens by reference to its parent call's full sequence
(the parent's prompt followed by its first choice's completion) and only the rest in
`prompt_token_suffix`, so a multi-turn trace costs linear, not quadratic, space.

Invariant: rebuilding never fails and never recurses. A call whose parent is not in the
store (a row the database refused) cannot be rebuilt: its prompt is None, like a call
whose tokens were never captured, and so is every call rebuilt from it; the learner does
not train on those, and every other call is rebuilt as usual. Chains of any length are
walked with a loop, and parents outside the given calls are fetched in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from store.call_rows import CallTokens

FetchCalls = Callable[[list[str]], Mapping[str, CallTokens]]
"""Given call ids, the rows of those the store has (the missing ones left out)."""


_BLOCK = 256


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids two sequences share. Of one type (two lists, two arrays), the
    comparisons run a block at a time in C: a long agent prompt that continues the last
    sequence whole costs one comparison, not a Python step per token."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def first_completion(choices: Any) -> list[int]:
    if not choices:
        return []
    return list(choices[0].get("token_ids") or [])


def _parent(call: CallTokens) -> str | None:
    """The call whose sequence this one's prompt starts with, if it refers to one."""
    if call.get("prompt_token_suffix") is None or not call.get("prompt_prefix_len"):
        return None
    return call.get("prompt_parent_id") or None


def materialize_prompts(
    calls: Sequence[CallTokens], fetch_calls: FetchCalls | None = None
) -> dict[str, list[int] | None]:
    """Full prompt token ids for each call (by id); None where they cannot be known (no
    tokens captured, or an ancestor missing from the store).

    `calls` are rows in order; parents outside them are looked up with `fetch_calls`.
    """
    by_id: dict[str, CallTokens] = {c["id"]: c for c in calls}
    _fetch_ancestors(by_id, fetch_calls)
    prompts: dict[str, list[int] | None] = {}
    for call in calls:
        _rebuild(call["id"], by_id, prompts)
    return {c["id"]: prompts[c["id"]] for c in calls}


def _fetch_ancestors(by_id: dict[str, CallTokens], fetch_calls: FetchCalls | None) -> None:
    """Add every ancestor the store has to `by_id`, one batch per generation."""
    asked: set[str] = set()
    frontier = list(by_id.values())
    while fetch_calls is not None:
        wanted = {p for c in frontier if (p := _parent(c)) and p not in by_id} - asked
        if not wanted:
            return
        asked |= wanted
        found = fetch_calls(sorted(wanted))
        by_id.update(found)
        frontier = list(found.values())


def _rebuild(
    call_id: str, by_id: dict[str, CallTokens], prompts: dict[str, list[int] | None]
) -> None:
    """The prompt of `call_id` and of its ancestors, oldest first, with a loop."""
    chain: list[str] = []
    current: str | None = call_id
    while current is not None and current not in prompts:
        call = by_id.get(current)
        if call is None:
            prompts[current] = None  # not in the store: nothing built on it can be known
            break
        if current in chain:  # a cycle (a corrupted row): as unknowable as a missing parent
            prompts[current] = None
            break
        chain.append(current)
        current = _parent(call)
    for call_id_ in reversed(chain):
        if call_id_ in prompts:
            continue
        call = by_id[call_id_]
        suffix = call.get("prompt_token_suffix")
        parent_id = _parent(call)
        if suffix is None:
            prompts[call_id_] = None
        elif parent_id is None:
            prompts[call_id_] = list(suffix)
        else:
            parent_prompt = prompts.get(parent_id)
            if parent_prompt is None:
                prompts[call_id_] = None
            else:
                parent = by_id[parent_id]
                full = parent_prompt + first_completion(parent.get("choices"))
                prefix_len = int(call["prompt_prefix_len"])
                # a parent shorter than the prefix it is said to hold: unknowable too
                known = len(full) >= prefix_len
                prompts[call_id_] = full[:prefix_len] + list(suffix) if known else None
