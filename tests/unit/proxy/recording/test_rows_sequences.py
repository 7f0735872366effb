"""proxy.recording.rows + proxy.recording.stitching: what the tracker keeps of a call's
tokens, and the prompt deltas built against it."""

from __future__ import annotations

import gc
import time
from typing import Any

import orjson

from proxy.base.capture import Capture, ChoiceCapture
from proxy.base.record import CallRecord
from proxy.recording.rows import RowBuilder, entry_of
from proxy.recording.stitching import TrajectoryTracker, new_id, token_array


def turn(prompt: list[Any], completion: list[Any]) -> dict[str, Any]:
    """One call of session "s", as the writer reads it back from the call log."""
    reply = {"role": "assistant", "content": "answer"}
    record = CallRecord(
        id=new_id(),
        api="chat.completions",
        session_key="s",
        started_at=time.time(),
        request={"model": "m", "messages": [{"role": "user", "content": "q"}]},
        response={"choices": [{"index": 0, "message": reply}]},
        capture=Capture(
            prompt_token_ids=prompt,
            choices=[ChoiceCapture(index=0, token_ids=completion, message=reply)],
            prompt_tokens=len(prompt),
            completion_tokens=len(completion),
        ),
        latency_ms=1.0,
    )
    record.chat_messages = record.request["messages"]
    return orjson.loads(orjson.dumps(entry_of(record)))


def test_token_array_takes_64_bit_ids_and_refuses_anything_else() -> None:
    ids = token_array([1, 2], [3, 2**63 - 1])
    assert ids is not None and list(ids) == [1, 2, 3, 2**63 - 1]
    assert token_array([2**63]) is None
    assert token_array([1, "2"]) is None
    assert token_array([1.5]) is None


def test_the_tracker_keeps_a_sequence_the_garbage_collector_never_walks() -> None:
    builder = RowBuilder(TrajectoryTracker(idle_timeout=300))
    first = list(range(100_000, 102_000))
    rows = builder.rows([turn(first, [7, 8])])
    state = builder.tracker.get(rows["trajectories"][0]["id"])
    assert state is not None
    assert list(state.last_sequence) == [*first, 7, 8]
    # a list would hand the collector each of its 2,002 ids at every collection
    assert not [r for r in gc.get_referents(state.last_sequence) if isinstance(r, int)]

    second = builder.rows([turn([*first, 7, 8, 9], [10])])["calls"][0]

    assert second["prompt_parent_id"] == rows["calls"][0]["id"]
    assert (second["prompt_prefix_len"], second["prompt_token_suffix"]) == (2002, [9])


def test_ids_that_are_not_integers_are_stored_whole_and_break_no_batch() -> None:
    builder = RowBuilder(TrajectoryTracker(idle_timeout=300))
    odd = builder.rows([turn([1, 2, "x"], [4])])["calls"][0]
    after_odd = builder.rows([turn([1, 2, 3, 4, 5], [6])])["calls"][0]
    after_good = builder.rows([turn([1, 2, 3, 4, 5, 6, 7], [8])])["calls"][0]

    assert odd["prompt_token_suffix"] == [1, 2, "x"]
    # nothing to store the next prompt against, then a delta again
    assert (after_odd["prompt_parent_id"], after_odd["prompt_token_suffix"]) == (
        None,
        [1, 2, 3, 4, 5],
    )
    assert after_good["prompt_parent_id"] == after_odd["id"]
    assert (after_good["prompt_prefix_len"], after_good["prompt_token_suffix"]) == (6, [7])
