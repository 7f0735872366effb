"""proxy.generation.fanout: which requests fan out, what the client gets, how the N choices
are recorded."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from proxy.api.dialect import OpenAIStream
from proxy.base.capture import CHAT, Capture, ChoiceCapture, ClientAsked, StreamAssembler
from proxy.base.record import CallRecord
from proxy.generation.fanout import (
    ChoiceZeroChunks,
    FanoutStream,
    choice_response,
    fanout_eligible,
    single_usage,
    split_capture,
)
from proxy.recording.rows import RowBuilder, Rows, entry_of
from proxy.recording.stitching import TrajectoryTracker
from store.tokens import materialize_prompts

SYSTEM = {"role": "system", "content": "be terse"}
USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "hello"}


# -- eligibility ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [USER]},
        {"messages": [SYSTEM, USER]},
        {"messages": [{"role": "developer", "content": "x"}, SYSTEM, USER]},
        {"messages": [USER, SYSTEM]},
        {"messages": [SYSTEM, USER], "n": 1},
        {"messages": [USER], "temperature": 1.0, "seed": 3, "max_tokens": 5},
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f"}}]},
        {"messages": [USER], "stream": True, "stream_options": {"include_usage": True}},
    ],
)
def test_single_turn_requests_fan_out(body: dict[str, Any]) -> None:
    assert fanout_eligible(body)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [SYSTEM, USER, REPLY, {"role": "user", "content": "more"}]},
        {"messages": [USER, REPLY]},
        {"messages": [USER, {"role": "tool", "tool_call_id": "1", "content": "4"}]},
        {"messages": [USER, USER]},
        {"messages": [SYSTEM]},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [USER, "junk"]},
        {"messages": [USER], "n": 2},
        {"messages": [USER], "n": True},
        {"messages": [USER], "temperature": 0},
        {"messages": [USER], "temperature": 0.0},
        {"messages": [USER], "use_beam_search": True},
        {"messages": [USER], "include_reasoning": False},
    ],
)
def test_other_requests_do_not(body: dict[str, Any]) -> None:
    assert not fanout_eligible(body)


# -- whole responses -----------------------------------------------------------------------


def _choice(index: int, text: str, ids: list[int]) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": {"content": [{"token": "t", "logprob": -1.0}] * len(ids)},
        "finish_reason": "length",
        "token_ids": ids,
    }


def _response() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [_choice(0, "a", [1, 2]), _choice(1, "b", [3, 4, 5]), _choice(2, "c", [6])],
        "usage": {
            "prompt_tokens": 4,
            "total_tokens": 10,
            "completion_tokens": 6,
            "prompt_tokens_details": None,
        },
        "prompt_token_ids": [9, 9, 9, 9],
    }


def test_choice_response_is_that_choice_alone_at_index_0() -> None:
    data = _response()
    before = copy.deepcopy(data)

    out = choice_response(data, 1, 3)

    assert [c["index"] for c in out["choices"]] == [0]
    assert out["choices"][0]["message"]["content"] == "b"
    assert out["choices"][0]["token_ids"] == [3, 4, 5]
    assert out["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": None,
    }
    assert out["id"] == "chatcmpl-1" and out["prompt_token_ids"] == [9, 9, 9, 9]
    assert data == before  # the upstream's response is left alone for the other choices


def test_choice_response_can_be_stripped_without_touching_the_others() -> None:
    from proxy.base.capture import strip_response

    data = _response()
    out = choice_response(data, 0, 2)
    strip_response(CHAT, out, ClientAsked(token_ids=False, logprobs=False, stream_usage=False))

    assert out["choices"][0]["token_ids"] is None and out["prompt_token_ids"] is None
    assert data["choices"][0]["token_ids"] == [1, 2] and data["prompt_token_ids"] is not None


def test_single_usage_without_total_or_count() -> None:
    assert single_usage({"prompt_tokens": 4, "completion_tokens": 9}, 2) == {
        "prompt_tokens": 4,
        "completion_tokens": 2,
    }
    assert single_usage(None, 2) is None
    assert single_usage({"completion_tokens": 9}, None) == {"completion_tokens": 9}


# -- captures ------------------------------------------------------------------------------


def _capture(usage_tokens: int) -> Capture:
    return Capture(
        prompt_token_ids=[9, 9, 9, 9],
        choices=[
            ChoiceCapture(index=0, token_ids=[1, 2], logprobs=[-1.0, -1.0], finish_reason="stop"),
            ChoiceCapture(index=1, token_ids=[3, 4, 5], logprobs=[-1.0] * 3, finish_reason="x"),
        ],
        prompt_tokens=4,
        completion_tokens=usage_tokens,
    )


def test_split_capture_gives_each_choice_its_own_complete_capture() -> None:
    parts = split_capture(_capture(5))

    assert [index for index, _ in parts] == [0, 1]
    for (_, part), ids in zip(parts, [[1, 2], [3, 4, 5]], strict=True):
        assert [c.index for c in part.choices] == [0]
        assert part.choices[0].token_ids == ids
        assert part.prompt_token_ids == [9, 9, 9, 9]
        assert part.completion_tokens == len(ids)
        assert part.complete
    assert parts[1][1].choices[0].finish_reason == "x"


def test_split_of_an_incomplete_capture_is_incomplete_everywhere() -> None:
    # usage says 6 tokens were sampled, 5 were captured: which choice lost one is unknown
    parts = split_capture(_capture(6))

    assert all(not part.complete for _, part in parts)


# -- streams -------------------------------------------------------------------------------

HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(index: int, delta: dict[str, Any], ids: list[int] | None, finish: str | None = None):
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None}
    choice["finish_reason"] = finish
    if ids is not None:
        choice["token_ids"] = ids
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -1.0}] * len(ids)}
    return {**HEAD, "choices": [choice]}


def _role(index: int) -> dict[str, Any]:
    chunk = _chunk(index, {"role": "assistant", "content": ""}, None)
    chunk["prompt_token_ids"] = [9, 9, 9, 9]
    return chunk


def _usage(completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": 4, "total_tokens": 4 + completion, "completion_tokens": completion}
    return {**HEAD, "choices": [], "usage": usage, "system_fingerprint": "fp"}


def _n2_stream() -> list[dict[str, Any]]:
    """Shaped like vLLM 0.32's n=2 stream with the proxy's flags."""
    return [
        _role(0),
        _role(1),
        _chunk(0, {"content": "ay"}, [359]),
        _chunk(0, {}, [346]),
        _chunk(1, {"content": "-"}, [15]),
        _chunk(0, {"content": " what"}, [465], "length"),
        _chunk(1, {}, [119]),
        _chunk(1, {"content": "ld"}, [391], "length"),
        _usage(6),
    ]


def _n1_stream() -> list[dict[str, Any]]:
    """What vLLM streams for the same request with n=1: choice 0's chunks, its usage."""
    return [c for c in _n2_stream()[:-1] if c["choices"][0]["index"] == 0] + [_usage(3)]


def test_choice_zero_chunks_keep_index_0_and_count_its_usage() -> None:
    chunks = ChoiceZeroChunks()

    out = [o for c in _n2_stream() if (o := chunks.feed(copy.deepcopy(c))) is not None]

    assert out == _n1_stream()
    assert chunks.tokens == 3


def test_mixed_chunks_keep_only_index_0_choices() -> None:
    chunk = {**HEAD, "choices": [_chunk(1, {"content": "b"}, [2])["choices"][0]]}
    chunk["choices"].insert(0, _chunk(0, {"content": "a"}, [1])["choices"][0])

    out = ChoiceZeroChunks().feed(chunk)

    assert out is not None and [c["index"] for c in out["choices"]] == [0]
    assert len(chunk["choices"]) == 2


def test_continuous_usage_is_already_per_choice_and_passes() -> None:
    chunk = _chunk(0, {"content": "a"}, [1])
    chunk["usage"] = {"prompt_tokens": 4, "total_tokens": 5, "completion_tokens": 1}

    assert ChoiceZeroChunks().feed(copy.deepcopy(chunk)) == chunk


@pytest.mark.parametrize("stream_usage", [False, True])
@pytest.mark.parametrize("ids", [False, True])
def test_client_gets_the_bytes_of_an_n1_stream(stream_usage: bool, ids: bool) -> None:
    asked = ClientAsked(token_ids=ids, logprobs=ids, stream_usage=stream_usage)
    fanned = FanoutStream(OpenAIStream(CHAT, asked))
    plain = OpenAIStream(CHAT, asked)

    got = b"".join(fanned.feed(copy.deepcopy(c)) for c in _n2_stream()) + fanned.end()
    want = b"".join(plain.feed(copy.deepcopy(c)) for c in _n1_stream()) + plain.end()

    assert got == want
    events = [orjson.loads(e[6:]) for e in got.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert {c["index"] for e in events for c in e["choices"]} == {0}


# -- recording -----------------------------------------------------------------------------


RowsOf = Callable[[list[CallRecord]], Rows]


@pytest.fixture
def rows_of() -> RowsOf:
    """The rows the writer builds for these records, as it reads them from the call log."""
    builder = RowBuilder(TrajectoryTracker(idle_timeout=300))
    return lambda records: builder.rows([orjson.loads(orjson.dumps(entry_of(r))) for r in records])


def _fanned_out(now: float) -> list[CallRecord]:
    """The client's record and its sibling, as Generation makes them for an n=2 fan-out."""
    assembler = StreamAssembler(CHAT)
    for chunk in _n2_stream():
        assembler.add(copy.deepcopy(chunk))
    (_, mine), (_, other) = split_capture(assembler.finish())
    request = {"model": "m", "messages": [SYSTEM, USER]}
    common = {"api": CHAT, "started_at": now, "request": request}
    client = CallRecord(
        id="c" * 32,
        session_key=None,
        chat_messages=request["messages"],
        capture=mine,
        group_key="fanout:" + "c" * 32,
        **common,
    )
    sibling = CallRecord(
        id="d" * 32,
        session_key=None,
        chat_messages=request["messages"],
        capture=other,
        group_key=client.group_key,
        fanout_parent=client.id,
        **common,
    )
    return [client, sibling]


def test_each_choice_is_its_own_trajectory_in_one_group(rows_of: RowsOf) -> None:
    rows = rows_of(_fanned_out(1000.0))

    client, sibling = rows["calls"]
    mine, other = rows["trajectories"]
    assert mine["group_key"] == other["group_key"] == "fanout:" + "c" * 32
    assert (mine["status"], other["status"]) == ("open", "finished")
    assert other["ended_at"] == 1000.0 and other["session_key"] is None
    assert mine["task_key"] == other["task_key"] == "msg:hi"
    assert client["trajectory_id"] == mine["id"] and sibling["trajectory_id"] == other["id"]
    assert client["choices"][0]["token_ids"] == [359, 346, 465]
    assert sibling["choices"][0]["token_ids"] == [15, 119, 391]
    assert [c["index"] for c in client["choices"] + sibling["choices"]] == [0, 0]
    assert client["capture_complete"] and sibling["capture_complete"]
    assert sibling["continuation_hash"] is None
    # the sibling's prompt is stored by reference to the client's call
    assert sibling["prompt_parent_id"] == client["id"]
    assert sibling["prompt_token_suffix"] == [] and sibling["prompt_len"] == 4
    prompts = materialize_prompts(rows["calls"])
    assert prompts[client["id"]] == prompts[sibling["id"]] == [9, 9, 9, 9]


def test_later_calls_continue_the_clients_choice_only(rows_of: RowsOf) -> None:
    first = rows_of(_fanned_out(1000.0))
    mine, other = first["trajectories"]
    chosen = {"role": "assistant", "content": "ay what"}
    sibling_reply = {"role": "assistant", "content": "-ld"}

    def follow_up(call_id: str, reply: dict[str, Any]) -> CallRecord:
        messages = [SYSTEM, USER, reply, {"role": "user", "content": "and?"}]
        return CallRecord(
            id=call_id,
            api=CHAT,
            session_key=None,
            started_at=1001.0,
            request={"messages": messages},
            chat_messages=messages,
            capture=Capture(prompt_token_ids=[9, 9, 9, 9, 359, 346, 465, 7]),
        )

    rows = rows_of([follow_up("e" * 32, chosen), follow_up("f" * 32, sibling_reply)])

    continued, fresh = rows["trajectories"]
    assert continued["id"] == mine["id"] and continued["group_key"] == mine["group_key"]
    assert fresh["id"] not in (mine["id"], other["id"]) and fresh["group_key"] is None
