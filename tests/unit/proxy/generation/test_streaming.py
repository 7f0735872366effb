"""proxy.generation.streaming.response_to_chunks: a whole chat completion re-emitted as a stream."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.base.capture import (
    CHAT,
    ClientAsked,
    StreamAssembler,
    capture_response,
    reply_message,
)
from proxy.generation.streaming import response_to_chunks

NOTHING = ClientAsked(token_ids=False, logprobs=False, stream_usage=False)
EVERYTHING = ClientAsked(token_ids=True, logprobs=True, stream_usage=True)

CALL_A = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
}
CALL_B = {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "t", "arguments": "{}"}}


def _choice(index: int, tokens: list[int], finish: str, **message: Any) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": None, **message},
        "logprobs": {"content": [{"token": "t", "logprob": -t / 4} for t in tokens]},
        "finish_reason": finish,
        "token_ids": tokens,
    }


def _response(*choices: dict[str, Any]) -> dict[str, Any]:
    completion = sum(len(c["token_ids"]) for c in choices)
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 77,
        "model": "tiny",
        "prompt_token_ids": [1, 2, 3],
        "choices": list(choices),
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": completion,
            "total_tokens": 3 + completion,
        },
    }


RESPONSES = {
    "content": _response(_choice(0, [5, 6], "stop", content="Hello")),
    "tool_calls": _response(_choice(0, [5, 6, 7], "tool_calls", tool_calls=[CALL_A])),
    "content_and_tools": _response(
        _choice(0, [5, 6, 7, 8], "tool_calls", content="Let me look.", tool_calls=[CALL_A, CALL_B])
    ),
    "n2": _response(
        _choice(0, [5], "stop", content="A"), _choice(1, [6, 7], "length", content="BB")
    ),
}


def _assemble(chunks: list[dict[str, Any]]) -> StreamAssembler:
    assembler = StreamAssembler(CHAT)
    for chunk in chunks:
        assembler.add(copy.deepcopy(chunk))
    return assembler


@pytest.mark.parametrize("name", sorted(RESPONSES))
@pytest.mark.parametrize("asked", [NOTHING, EVERYTHING], ids=["nothing", "everything"])
def test_chunks_reassemble_to_the_same_message(name: str, asked: ClientAsked) -> None:
    data = RESPONSES[name]

    capture = _assemble(response_to_chunks(data, asked)).finish()

    assert [c.message for c in capture.choices] == [
        reply_message(c["message"]) for c in data["choices"]
    ]
    assert [c.finish_reason for c in capture.choices] == [
        c["finish_reason"] for c in data["choices"]
    ]


def test_chunks_carry_the_response_head() -> None:
    chunks = response_to_chunks(RESPONSES["content"], NOTHING)

    assert len(chunks) == 3  # role, content, finish
    for chunk in chunks:
        assert (chunk["id"], chunk["object"], chunk["created"], chunk["model"]) == (
            "chatcmpl-9",
            "chat.completion.chunk",
            77,
            "tiny",
        )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hello"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None]


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_nothing_asked_means_no_usage_no_tokens_no_logprobs(name: str) -> None:
    chunks = response_to_chunks(RESPONSES[name], NOTHING)

    for chunk in chunks:
        assert "usage" not in chunk
        assert "prompt_token_ids" not in chunk
        [choice] = chunk["choices"]
        assert "token_ids" not in choice
        assert choice["logprobs"] is None


def test_usage_chunk_only_when_asked() -> None:
    data = RESPONSES["n2"]
    asked = ClientAsked(token_ids=False, logprobs=False, stream_usage=True)

    chunks = response_to_chunks(data, asked)

    assert chunks[-1] == {
        "id": "chatcmpl-9",
        "object": "chat.completion.chunk",
        "created": 77,
        "model": "tiny",
        "choices": [],
        "usage": data["usage"],
    }
    assert all("usage" not in c for c in chunks[:-1])
    assert _assemble(chunks).response()["usage"] == {"prompt_tokens": 3, "completion_tokens": 3}


def test_token_ids_only_when_asked() -> None:
    data = RESPONSES["n2"]
    asked = ClientAsked(token_ids=True, logprobs=False, stream_usage=False)

    chunks = response_to_chunks(data, asked)

    with_prompt = [i for i, c in enumerate(chunks) if "prompt_token_ids" in c]
    assert with_prompt == [0]
    assert chunks[0]["prompt_token_ids"] == [1, 2, 3]
    tokens = [
        (c["choices"][0]["index"], c["choices"][0]["token_ids"])
        for c in chunks
        if "token_ids" in c["choices"][0]
    ]
    assert tokens == [(0, [5]), (1, [6, 7])]
    assert [c.token_ids for c in _assemble(chunks).finish().choices] == [[5], [6, 7]]


@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_everything_asked_captures_what_the_whole_response_does(name: str) -> None:
    data = RESPONSES[name]

    streamed = _assemble(response_to_chunks(data, EVERYTHING)).finish()
    whole = capture_response(CHAT, data)

    assert streamed == whole
    assert streamed.complete


def test_logprobs_of_a_tool_call_only_reply_reach_the_client() -> None:
    data = RESPONSES["tool_calls"]
    asked = ClientAsked(token_ids=False, logprobs=True, stream_usage=False)

    chunks = response_to_chunks(data, asked)
    capture = _assemble(chunks).finish()

    assert capture.choices[0].logprobs == [-1.25, -1.5, -1.75]
    assert all("token_ids" not in c["choices"][0] for c in chunks)


def test_a_tool_call_only_reply_sends_no_empty_chunk_when_nothing_was_asked() -> None:
    chunks = response_to_chunks(RESPONSES["tool_calls"], NOTHING)

    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"tool_calls": [{"index": 0, **CALL_A}]},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_reasoning_of_a_reply_survives_rechunking(key: str) -> None:
    # vLLM 0.32 names it `reasoning`; older servers `reasoning_content`
    data = _response(_choice(0, [5, 6], "stop", content="42", **{key: "six times seven"}))

    chunks = response_to_chunks(data, NOTHING)
    capture = _assemble(chunks).finish()

    assert chunks[1]["choices"][0]["delta"] == {key: "six times seven", "content": "42"}
    assert capture.choices[0].message == {
        "role": "assistant",
        "content": "42",
        "reasoning": "six times seven",
    }


@pytest.mark.parametrize("asked", [NOTHING, EVERYTHING], ids=["nothing", "everything"])
def test_rechunked_reply_keeps_the_system_fingerprint(asked: ClientAsked) -> None:
    data = {**RESPONSES["n2"], "system_fingerprint": "vllm-0.32.0-abc"}

    chunks = response_to_chunks(data, asked)

    stamped = [i for i, c in enumerate(chunks) if c.get("system_fingerprint")]
    if asked.stream_usage:
        assert stamped == [len(chunks) - 1]
    else:
        assert [chunks[i]["choices"][0]["finish_reason"] for i in stamped] == ["stop", "length"]
