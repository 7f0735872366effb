"""proxy.base.capture: what goes upstream, what is captured, and what the client gets back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from proxy.base.capture import (
    CHAT,
    COMPLETIONS,
    Capture,
    ChoiceCapture,
    ChunkFilter,
    ClientAsked,
    StreamAssembler,
    capture_response,
    prepare_upstream_body,
    reply_message,
    strip_response,
)

NOTHING = ClientAsked(token_ids=False, logprobs=False, stream_usage=False)
EVERYTHING = ClientAsked(token_ids=True, logprobs=True, stream_usage=True)
MESSAGES = [{"role": "user", "content": "hi"}]


# -- prepare_upstream_body -----------------------------------------------------------------


def test_chat_body_gets_capture_flags_and_client_asked_nothing() -> None:
    body = {"model": "m", "messages": MESSAGES}
    before = copy.deepcopy(body)

    upstream, asked = prepare_upstream_body(CHAT, body)

    assert upstream == {
        "model": "m",
        "messages": MESSAGES,
        "return_token_ids": True,
        "logprobs": True,
    }
    assert asked == NOTHING
    assert body == before


def test_completions_body_asks_for_sampled_token_logprobs_only() -> None:
    upstream, asked = prepare_upstream_body(COMPLETIONS, {"model": "m", "prompt": "x"})

    # completions takes an int (top-k count); 0 means just the sampled token's logprob
    assert type(upstream["logprobs"]) is int
    assert upstream["logprobs"] == 0
    assert upstream["return_token_ids"] is True
    assert asked == NOTHING


@pytest.mark.parametrize(
    ("api", "logprobs", "asked"),
    [
        (CHAT, True, True),
        (CHAT, False, False),
        (CHAT, None, False),
        (COMPLETIONS, 0, True),  # 0 is a request: "the sampled token only"
        (COMPLETIONS, 5, True),
        (COMPLETIONS, None, False),
        (COMPLETIONS, False, False),
    ],
)
def test_client_logprobs_request_is_remembered(api: str, logprobs: Any, asked: bool) -> None:
    body: dict[str, Any] = {"model": "m", "logprobs": logprobs}
    body["messages" if api == CHAT else "prompt"] = MESSAGES if api == CHAT else "x"

    upstream, client = prepare_upstream_body(api, body)

    assert client.logprobs is asked
    if asked:
        assert upstream["logprobs"] == logprobs  # the client's own value goes through
    else:
        assert upstream["logprobs"] == (True if api == CHAT else 0)


def test_client_top_logprobs_and_token_ids_pass_through() -> None:
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 3, "return_token_ids": True}

    upstream, asked = prepare_upstream_body(CHAT, body)

    assert upstream["top_logprobs"] == 3
    assert upstream["logprobs"] is True
    assert asked == ClientAsked(token_ids=True, logprobs=True, stream_usage=False)


def test_stream_usage_is_merged_into_the_clients_stream_options() -> None:
    options = {"include_usage": False, "continuous_usage_stats": True}
    body = {"messages": MESSAGES, "stream": True, "stream_options": options}
    before = copy.deepcopy(body)

    upstream, asked = prepare_upstream_body(CHAT, body)

    assert upstream["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert asked.stream_usage is False
    assert body == before
    assert upstream["stream_options"] is not options


@pytest.mark.parametrize("options", [None, "absent"])
def test_stream_without_options_gets_include_usage(options: Any) -> None:
    body: dict[str, Any] = {"messages": MESSAGES, "stream": True}
    if options != "absent":
        body["stream_options"] = options

    upstream, asked = prepare_upstream_body(CHAT, body)

    assert upstream["stream_options"] == {"include_usage": True}
    assert asked.stream_usage is False


def test_client_include_usage_is_remembered() -> None:
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}

    upstream, asked = prepare_upstream_body(COMPLETIONS, body)

    assert asked.stream_usage is True
    assert upstream["stream_options"] == {"include_usage": True}


def test_non_streaming_body_gets_no_stream_options() -> None:
    upstream, _ = prepare_upstream_body(CHAT, {"messages": MESSAGES, "stream": False})

    assert "stream_options" not in upstream


# -- capture_response ----------------------------------------------------------------------


def _chat_choice(index: int, tokens: list[int], text: str, **message: Any) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text, **message},
        "logprobs": {
            "content": [{"token": f"t{t}", "logprob": -0.5 * t, "top_logprobs": []} for t in tokens]
        },
        "finish_reason": "stop",
        "token_ids": tokens,
    }


def test_capture_chat_response() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    data = {
        "id": "x",
        "object": "chat.completion",
        "prompt_token_ids": [1, 2, 3],
        "choices": [_chat_choice(0, [7, 8], "", tool_calls=[call], reasoning="hmm", refusal=None)],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    data["choices"][0]["finish_reason"] = "tool_calls"

    capture = capture_response(CHAT, data)

    assert capture.prompt_token_ids == [1, 2, 3]
    assert (capture.prompt_tokens, capture.completion_tokens) == (3, 2)
    [choice] = capture.choices
    assert choice.token_ids == [7, 8]
    assert choice.logprobs == [-3.5, -4.0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert capture.complete


def test_capture_chat_n2_choices_are_sorted_by_index() -> None:
    data = {
        "prompt_token_ids": [1],
        "choices": [_chat_choice(1, [5, 6, 7], "b"), _chat_choice(0, [4], "a")],
        "usage": {"prompt_tokens": 1, "completion_tokens": 4},
    }

    capture = capture_response(CHAT, data)

    assert [c.index for c in capture.choices] == [0, 1]
    assert [c.token_ids for c in capture.choices] == [[4], [5, 6, 7]]
    assert [c.message["content"] for c in capture.choices] == ["a", "b"]
    assert capture.choices[1].logprobs == [-2.5, -3.0, -3.5]
    assert capture.complete


def test_capture_completions_response() -> None:
    data = {
        "object": "text_completion",
        "choices": [
            {
                "index": 1,
                "text": " world!",
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.25, -1.0]},
                "finish_reason": "length",
                "token_ids": [30, 31],
                "prompt_token_ids": [9, 10],
            },
            {
                "index": 0,
                "text": " there",
                "logprobs": {"tokens": ["c"], "token_logprobs": [-2.0]},
                "finish_reason": "stop",
                "token_ids": [40],
                "prompt_token_ids": [9, 10],
            },
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
    }

    capture = capture_response(COMPLETIONS, data)

    assert capture.prompt_token_ids == [9, 10]
    assert [c.index for c in capture.choices] == [0, 1]
    assert [c.text for c in capture.choices] == [" there", " world!"]
    assert [c.logprobs for c in capture.choices] == [[-2.0], [-0.25, -1.0]]
    assert [c.finish_reason for c in capture.choices] == ["stop", "length"]
    assert capture.choices[0].message is None
    assert capture.complete


def test_capture_without_token_ids_is_incomplete() -> None:
    data = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }

    capture = capture_response(CHAT, data)

    assert capture.prompt_token_ids is None
    assert capture.choices[0].token_ids == []
    assert capture.choices[0].logprobs == []
    assert not capture.complete


def test_reply_message_keeps_only_what_a_client_sends_back() -> None:
    message = {"role": "assistant", "content": "hi", "refusal": None, "reasoning": "r"}

    assert reply_message(message) == {"role": "assistant", "content": "hi"}
    assert reply_message({"content": None, "tool_calls": []}) == {
        "role": "assistant",
        "content": None,
    }


# -- Capture.complete ----------------------------------------------------------------------


def _capture(**changes: Any) -> Capture:
    capture = Capture(
        prompt_token_ids=[1, 2, 3],
        choices=[
            ChoiceCapture(index=0, token_ids=[4, 5], logprobs=[-0.1, -0.2]),
            ChoiceCapture(index=1, token_ids=[6, 7, 8], logprobs=[-0.1, -0.2, -0.3]),
        ],
        prompt_tokens=3,
        completion_tokens=5,
    )
    for name, value in changes.items():
        setattr(capture, name, value)
    return capture


def test_capture_that_agrees_with_usage_is_complete() -> None:
    assert _capture().complete


@pytest.mark.parametrize(
    "changes",
    [
        {"prompt_tokens": 4},
        {"completion_tokens": 4},  # the sum over choices is 5
        {"completion_tokens": 2},  # only the first choice's count
        {"completion_tokens": None},
        {"prompt_token_ids": None},
        {"choices": []},
    ],
    ids=repr,
)
def test_capture_that_disagrees_with_usage_is_incomplete(changes: dict[str, Any]) -> None:
    assert not _capture(**changes).complete


def test_capture_with_a_missing_logprob_is_incomplete() -> None:
    capture = _capture()
    capture.choices[1].logprobs.pop()

    assert not capture.complete


# -- strip_response ------------------------------------------------------------------------


def _chat_response() -> dict[str, Any]:
    return {
        "id": "x",
        "prompt_token_ids": [1, 2],
        "choices": [_chat_choice(0, [3], "a"), _chat_choice(1, [4], "b")],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }


def test_strip_chat_response_nulls_everything_the_proxy_asked_for() -> None:
    data = _chat_response()

    strip_response(CHAT, data, NOTHING)

    # vLLM keeps these keys, as null, when the flags are off: null them, never delete them
    assert data == {
        "id": "x",
        "prompt_token_ids": None,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "stop",
                "token_ids": None,
            }
            for i, text in enumerate("ab")
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }


def test_strip_chat_response_keeps_what_the_client_asked_for() -> None:
    data = _chat_response()
    strip_response(CHAT, data, ClientAsked(token_ids=True, logprobs=False, stream_usage=False))
    assert data["prompt_token_ids"] == [1, 2]
    assert [c["token_ids"] for c in data["choices"]] == [[3], [4]]
    assert [c["logprobs"] for c in data["choices"]] == [None, None]

    data = _chat_response()
    strip_response(CHAT, data, ClientAsked(token_ids=False, logprobs=True, stream_usage=False))
    assert data["prompt_token_ids"] is None
    assert data["choices"][0]["logprobs"] == _chat_response()["choices"][0]["logprobs"]
    assert [c["token_ids"] for c in data["choices"]] == [None, None]

    data = _chat_response()
    strip_response(CHAT, data, EVERYTHING)
    assert data == _chat_response()


def test_strip_response_adds_no_keys_that_were_not_there() -> None:
    data = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]}

    strip_response(CHAT, data, NOTHING)

    assert data == {
        "id": "x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}],
    }


def test_strip_completions_response_nulls_per_choice_prompt_ids() -> None:
    choice = {"index": 0, "text": "x", "logprobs": {"token_logprobs": [-1.0]}, "token_ids": [5]}
    data = {"choices": [{**choice, "prompt_token_ids": [1]}]}

    strip_response(COMPLETIONS, data, NOTHING)
    assert data == {
        "choices": [
            {"index": 0, "text": "x", "logprobs": None, "token_ids": None, "prompt_token_ids": None}
        ]
    }

    data = {"choices": [{**choice, "prompt_token_ids": [1]}]}
    strip_response(COMPLETIONS, data, EVERYTHING)
    assert data == {"choices": [{**choice, "prompt_token_ids": [1]}]}


# -- ChunkFilter ---------------------------------------------------------------------------

HEAD = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
USAGE = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
TOKENS_ONLY = ClientAsked(token_ids=True, logprobs=False, stream_usage=False)
LOGPROBS_ONLY = ClientAsked(token_ids=False, logprobs=True, stream_usage=False)
USAGE_ONLY = ClientAsked(token_ids=False, logprobs=False, stream_usage=True)


def _c(
    delta: dict[str, Any] | None = None,
    index: int = 0,
    token: int | None = 5,
    finish: str | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A chat chunk as vLLM streams it with the proxy's flags on (logprobs, token ids)."""
    choice: dict[str, Any] = {
        "index": index,
        "delta": {"content": "a"} if delta is None else delta,
        "logprobs": None if token is None else {"content": [{"token": "a", "logprob": -1.0}]},
        "finish_reason": finish,
        "token_ids": None if token is None else [token],
    }
    return {**HEAD, "choices": [choice], **top}


def _role(index: int = 0, **top: Any) -> dict[str, Any]:
    choice = {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return {**HEAD, "choices": [choice], **top}


def _usage_only(fingerprint: str | None = "fp_1") -> dict[str, Any]:
    chunk: dict[str, Any] = {**HEAD, "choices": [], "usage": dict(USAGE)}
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    return chunk


def _feed_all(
    chunk_filter: ChunkFilter, chunks: list[dict[str, Any]]
) -> list[list[dict[str, Any]]]:
    """What each feed returned, then what end() returned (the last entry)."""
    return [chunk_filter.feed(copy.deepcopy(c)) for c in chunks] + [chunk_filter.end()]


def test_chunk_filter_nulls_token_ids_and_logprobs_the_client_did_not_ask_for() -> None:
    chunk_filter = ChunkFilter(CHAT, NOTHING)

    [out] = chunk_filter.feed(_c(prompt_token_ids=[1, 2]))

    assert out == {
        **HEAD,
        "prompt_token_ids": None,
        "choices": [
            {
                "index": 0,
                "delta": {"content": "a"},
                "logprobs": None,
                "finish_reason": None,
                "token_ids": None,
            }
        ],
    }


def test_chunk_filter_keeps_what_the_client_asked_for() -> None:
    chunks = [_role(prompt_token_ids=[1, 2]), _c(), _c({}), _c({}, finish="stop"), _usage_only()]

    sent = _feed_all(ChunkFilter(CHAT, EVERYTHING), chunks)

    assert sent == [[c] for c in chunks] + [[]]


@pytest.mark.parametrize(
    ("asked", "kept"),
    [
        (TOKENS_ONLY, {"prompt_token_ids": [1, 2], "token_ids": [5], "logprobs": None}),
        (
            LOGPROBS_ONLY,
            {
                "prompt_token_ids": None,
                "token_ids": None,
                "logprobs": {"content": [{"token": "a", "logprob": -1.0}]},
            },
        ),
    ],
    ids=["token_ids", "logprobs"],
)
def test_chunk_filter_nulls_each_field_on_its_own(asked: ClientAsked, kept: dict[str, Any]) -> None:
    [out] = ChunkFilter(CHAT, asked).feed(_c(prompt_token_ids=[1, 2]))

    assert out["prompt_token_ids"] == kept["prompt_token_ids"]
    assert out["choices"][0]["token_ids"] == kept["token_ids"]
    assert out["choices"][0]["logprobs"] == kept["logprobs"]


def test_chunk_filter_adds_no_keys_that_were_not_there() -> None:
    [out] = ChunkFilter(CHAT, NOTHING).feed(_role())

    assert out == _role()


def test_chunk_filter_nulls_completions_per_choice_prompt_ids() -> None:
    choice = {
        "index": 0,
        "text": "a",
        "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0]},
        "finish_reason": None,
        "token_ids": [5],
        "prompt_token_ids": [1],
    }

    [out] = ChunkFilter(COMPLETIONS, NOTHING).feed({"id": "c", "choices": [choice]})

    assert out == {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "text": "a",
                "logprobs": None,
                "finish_reason": None,
                "token_ids": None,
                "prompt_token_ids": None,
            }
        ],
    }


@pytest.mark.parametrize(
    ("asked", "dropped"),
    [(NOTHING, True), (USAGE_ONLY, True), (TOKENS_ONLY, False), (LOGPROBS_ONLY, False)],
    ids=["nothing", "usage", "token_ids", "logprobs"],
)
def test_empty_delta_chunks_are_dropped_only_when_no_token_field_was_asked(
    asked: ClientAsked, dropped: bool
) -> None:
    # vLLM skips a token that made no text unless it must send its token id or logprob
    chunk_filter = ChunkFilter(CHAT, asked)

    sent = chunk_filter.feed(_c({}, token=7))

    assert len(sent) == (0 if dropped else 1)
    if not dropped:
        assert sent[0]["choices"][0]["delta"] == {}
    assert chunk_filter.end() == []


def test_only_entirely_empty_chunks_are_dropped() -> None:
    chunk_filter = ChunkFilter(CHAT, USAGE_ONLY)
    both_empty = {**HEAD, "choices": [_c({})["choices"][0], _c({}, index=1)["choices"][0]]}
    one_empty = {**HEAD, "choices": [_c({})["choices"][0], _c(index=1)["choices"][0]]}

    assert chunk_filter.feed(copy.deepcopy(both_empty)) == []
    assert len(chunk_filter.feed(copy.deepcopy(one_empty))) == 1
    # text chunks with empty text, and empty finishing chunks, are never dropped
    assert len(chunk_filter.feed(_role())) == 1
    assert len(chunk_filter.feed(_c({"content": ""}))) == 1
    assert len(chunk_filter.feed(_c({}, finish="stop"))) == 1


def test_empty_completions_chunks_are_never_dropped() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "text": "", "finish_reason": None}]}

    assert ChunkFilter(COMPLETIONS, USAGE_ONLY).feed(copy.deepcopy(chunk)) == [chunk]


def test_usage_chunk_is_dropped_and_its_fingerprint_moves_to_the_finish_chunk() -> None:
    chunks = [_role(), _c(), _c({}, token=6, finish="stop"), _usage_only("fp_1")]

    sent = _feed_all(ChunkFilter(CHAT, NOTHING), chunks)

    assert [len(out) for out in sent] == [1, 1, 0, 1, 0]  # the finish chunk waits for usage
    [finish] = sent[3]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["system_fingerprint"] == "fp_1"
    assert "usage" not in finish
    assert all("system_fingerprint" not in out[0] for out in sent[:2])


def test_usage_chunk_without_fingerprint_releases_the_finish_chunk_unchanged() -> None:
    chunk_filter = ChunkFilter(CHAT, NOTHING)

    assert chunk_filter.feed(_c({}, token=None, finish="length")) == []
    [finish] = chunk_filter.feed(_usage_only(fingerprint=None))

    assert finish == _c({}, token=None, finish="length")
    assert chunk_filter.end() == []


def test_n2_both_finish_chunks_are_held_and_get_the_fingerprint() -> None:
    chunks = [
        _role(0),
        _role(1),
        _c({"content": "A"}, index=0),
        _c({"content": "B"}, index=1),
        _c({}, index=0, token=8, finish="stop"),
        _c({}, index=1, token=9, finish="length"),
        _usage_only("fp_2"),
    ]

    sent = _feed_all(ChunkFilter(CHAT, NOTHING), chunks)

    assert [len(out) for out in sent] == [1, 1, 1, 1, 0, 0, 2, 0]
    first, second = sent[6]
    assert (first["choices"][0]["index"], first["choices"][0]["finish_reason"]) == (0, "stop")
    assert (second["choices"][0]["index"], second["choices"][0]["finish_reason"]) == (1, "length")
    assert first["system_fingerprint"] == second["system_fingerprint"] == "fp_2"


def test_chunks_after_a_held_finish_chunk_wait_behind_it() -> None:
    # n=2: choice 0 finishes while choice 1 is still streaming
    chunks = [
        _role(0),
        _role(1),
        _c({}, index=0, token=8, finish="stop"),
        _c({"content": "B"}, index=1),
        _c({}, index=1, token=10),  # dropped even while others are held
        _c({"content": "C"}, index=1, finish="length"),
        _usage_only("fp_3"),
    ]

    sent = _feed_all(ChunkFilter(CHAT, NOTHING), chunks)

    assert [len(out) for out in sent] == [1, 1, 0, 0, 0, 0, 3, 0]
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in sent[6]] == [
        (0, {}),
        (1, {"content": "B"}),
        (1, {"content": "C"}),
    ]
    assert [c["choices"][0]["finish_reason"] for c in sent[6]] == ["stop", None, "length"]
    assert all(c["choices"][0]["token_ids"] is None for c in sent[6])


def test_end_flushes_held_chunks_when_no_usage_chunk_comes() -> None:
    chunk_filter = ChunkFilter(CHAT, NOTHING)
    chunks = [_c({}, token=8, finish="stop"), _c({"content": "x"}, index=1)]

    assert [chunk_filter.feed(copy.deepcopy(c)) for c in chunks] == [[], []]
    held = chunk_filter.end()

    assert [c["choices"][0]["index"] for c in held] == [0, 1]
    assert all("system_fingerprint" not in c for c in held)
    assert held[0]["choices"][0]["token_ids"] is None  # nulled on the way in
    assert chunk_filter.end() == []


def test_nothing_is_held_when_the_client_asked_for_usage() -> None:
    chunks = [
        _role(),
        _c({}, index=0, token=8, finish="stop"),
        _c({"content": "C"}, index=1, finish="length"),
        _usage_only("fp_4"),
    ]

    sent = _feed_all(ChunkFilter(CHAT, USAGE_ONLY), chunks)

    assert [len(out) for out in sent] == [1, 1, 1, 1, 0]
    assert "system_fingerprint" not in sent[1][0]
    assert sent[3] == [_usage_only("fp_4")]


def test_usage_on_a_content_chunk_is_not_mistaken_for_the_usage_chunk() -> None:
    chunk_filter = ChunkFilter(CHAT, NOTHING)

    assert len(chunk_filter.feed(_c(usage=dict(USAGE)))) == 1
    assert chunk_filter.feed(_c({}, finish="stop", usage=dict(USAGE))) == []
    assert len(chunk_filter.feed(_usage_only())) == 1


# A vLLM 0.32 chat stream, built the way its serving code builds one, so that a stream
# with the proxy's flags on can be compared to the one the client would have got without.


def _vllm_chat_stream(
    events: list[tuple[int, dict[str, Any] | None, int, str | None]],
    n: int,
    *,
    logprobs: bool,
    token_ids: bool,
    include_usage: bool,
    fingerprint: str | None,
) -> list[dict[str, Any]]:
    """`events`: (choice index, delta or None for a token that made no text, token, finish)."""
    stream = []
    for i in range(n):
        stream.append(_role(i, prompt_token_ids=[1, 2] if token_ids else None))
    for index, delta, token, finish in events:
        lp = {"content": [{"token": f"t{token}", "logprob": -token / 8}]} if logprobs else None
        if delta is None:
            if finish is None and lp is None and not token_ids:
                continue  # vLLM streams nothing for this token
            delta = {}
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": lp,
            "finish_reason": finish,
            "token_ids": [token] if token_ids else None,
        }
        if finish is not None:
            choice["stop_reason"] = None
        chunk: dict[str, Any] = {**HEAD, "choices": [choice]}
        if not include_usage and fingerprint is not None and finish is not None:
            chunk["system_fingerprint"] = fingerprint
        stream.append(chunk)
    if include_usage:
        usage = {"prompt_tokens": 2, "completion_tokens": len(events), "total_tokens": 0}
        usage["total_tokens"] = 2 + len(events)
        last: dict[str, Any] = {**HEAD, "choices": [], "usage": usage}
        if fingerprint is not None:
            last["system_fingerprint"] = fingerprint
        stream.append(last)
    return stream


VLLM_STREAMS = {
    "n1": (
        1,
        [
            (0, {"content": "Hi"}, 10, None),
            (0, None, 11, None),  # e.g. a tool-call control token
            (0, {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}, 12, None),
            (0, None, 13, "tool_calls"),
        ],
    ),
    "n2_together": (
        2,
        [
            (0, {"content": "A"}, 10, None),
            (1, {"content": "B"}, 20, None),
            (0, None, 11, None),
            (1, {"content": "C"}, 21, None),
            (0, {"content": "D"}, 12, "stop"),
            (1, None, 22, "stop"),
        ],
    ),
    "n2_interleaved": (
        2,
        [
            (0, {"content": "A"}, 10, None),
            (1, {"content": "B"}, 20, None),
            (0, None, 11, "stop"),
            (1, None, 21, None),
            (1, {"content": "C"}, 22, None),
            (1, {"content": "D"}, 23, "length"),
        ],
    ),
}
ALL_ASKED = [
    ClientAsked(token_ids=t, logprobs=lp, stream_usage=u)
    for t in (False, True)
    for lp in (False, True)
    for u in (False, True)
]


def _filtered(name: str, asked: ClientAsked, fingerprint: str | None) -> list[dict[str, Any]]:
    n, events = VLLM_STREAMS[name]
    upstream = _vllm_chat_stream(
        events, n, logprobs=True, token_ids=True, include_usage=True, fingerprint=fingerprint
    )
    chunk_filter = ChunkFilter(CHAT, asked)
    sent = [out for chunk in upstream for out in chunk_filter.feed(chunk)]
    return sent + chunk_filter.end()


def _unflagged(name: str, asked: ClientAsked, fingerprint: str | None) -> list[dict[str, Any]]:
    n, events = VLLM_STREAMS[name]
    return _vllm_chat_stream(
        events,
        n,
        logprobs=asked.logprobs,
        token_ids=asked.token_ids,
        include_usage=asked.stream_usage,
        fingerprint=fingerprint,
    )


@pytest.mark.parametrize("asked", ALL_ASKED, ids=repr)
@pytest.mark.parametrize(
    ("name", "fingerprint"),
    [
        ("n1", "fp_9"),
        ("n1", None),
        ("n2_together", "fp_9"),
        ("n2_together", None),
        ("n2_interleaved", None),
    ],
)
def test_filtered_stream_equals_what_vllm_sends_without_the_flags(
    name: str, fingerprint: str | None, asked: ClientAsked
) -> None:
    assert _filtered(name, asked, fingerprint) == _unflagged(name, asked, fingerprint)


@pytest.mark.parametrize("asked", [NOTHING, TOKENS_ONLY], ids=["nothing", "token_ids"])
def test_fingerprint_only_on_finish_chunks_when_choices_finish_apart(asked: ClientAsked) -> None:
    assert _filtered("n2_interleaved", asked, "fp_9") == _unflagged("n2_interleaved", asked, "fp_9")


def test_continuous_usage_the_client_did_not_get_is_removed() -> None:
    body = {
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    upstream_body, asked = prepare_upstream_body(CHAT, body)
    assert upstream_body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    chunk_filter = ChunkFilter(CHAT, asked)
    chunks = [_role(usage=dict(USAGE)), _c(usage=dict(USAGE)), _c({}, finish="stop", usage=USAGE)]

    sent = [out for chunk in [*chunks, _usage_only()] for out in chunk_filter.feed(chunk)]

    assert len(sent) == 3
    assert all("usage" not in chunk for chunk in sent + chunk_filter.end())


# -- StreamAssembler -----------------------------------------------------------------------


def _delta_chunk(
    delta: dict[str, Any],
    index: int = 0,
    tokens: list[int] | None = None,
    finish: str | None = None,
    **top: Any,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish}
    if tokens is not None:
        choice["token_ids"] = tokens
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -float(t)} for t in tokens]}
    else:
        choice["logprobs"] = None
    return {"id": "cmpl-1", "created": 123, "model": "m", "choices": [choice], **top}


def _usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {"id": "cmpl-1", "created": 123, "model": "m", "choices": [], "usage": usage}


def test_assemble_chat_content_stream() -> None:
    assembler = StreamAssembler(CHAT)
    chunks = [
        _delta_chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]),
        _delta_chunk({"content": "Hel"}, tokens=[10]),
        _delta_chunk({"content": "lo"}, tokens=[11, 12]),
        _delta_chunk({}, finish="stop"),
        _usage_chunk(3, 3),
    ]
    assert not assembler.saw_output
    assembler.add(chunks[0])
    assert not assembler.saw_output  # the role chunk is not output yet
    for chunk in chunks[1:]:
        assembler.add(chunk)
    assert assembler.saw_output

    assert assembler.response() == {
        "id": "cmpl-1",
        "created": 123,
        "model": "m",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    capture = assembler.capture
    assert capture.prompt_token_ids == [1, 2, 3]
    assert capture.choices[0].token_ids == [10, 11, 12]
    assert capture.choices[0].logprobs == [-10.0, -11.0, -12.0]
    assert capture.complete


def test_assemble_tool_calls_split_over_chunks() -> None:
    assembler = StreamAssembler(CHAT)
    first = {"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather"}}
    second = {"index": 1, "id": "call_b", "type": "function", "function": {"name": "time"}}
    chunks = [
        _delta_chunk({"role": "assistant"}, prompt_token_ids=[1]),
        _delta_chunk({"tool_calls": [first]}, tokens=[20]),
        _delta_chunk(
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}, tokens=[21]
        ),
        _delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": '}}]}),
        _delta_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _delta_chunk({"tool_calls": [second]}, tokens=[22]),
        _delta_chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        _delta_chunk({}, finish="tool_calls"),
    ]
    for chunk in chunks:
        assembler.add(chunk)

    [choice] = assembler.finish().choices

    assert choice.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
        ],
    }
    assert choice.finish_reason == "tool_calls"
    assert choice.token_ids == [20, 21, 22]
    assert assembler.saw_output


def test_assemble_two_interleaved_choices() -> None:
    assembler = StreamAssembler(CHAT)
    chunks = [
        _delta_chunk({"role": "assistant", "content": ""}, index=1, prompt_token_ids=[1, 2]),
        _delta_chunk({"role": "assistant", "content": ""}, index=0),
        _delta_chunk({"content": "B1"}, index=1, tokens=[31]),
        _delta_chunk({"content": "A1"}, index=0, tokens=[21]),
        _delta_chunk({"content": "A2"}, index=0, tokens=[22]),
        _delta_chunk({"content": "B2"}, index=1, tokens=[32]),
        _delta_chunk({}, index=1, finish="length"),
        _delta_chunk({}, index=0, finish="stop"),
        _usage_chunk(2, 4),
    ]
    for chunk in chunks:
        assembler.add(chunk)

    response = assembler.response()

    assert [
        (c["index"], c["message"]["content"], c["finish_reason"]) for c in response["choices"]
    ] == [
        (0, "A1A2", "stop"),
        (1, "B1B2", "length"),
    ]
    capture = assembler.capture
    assert [c.token_ids for c in capture.choices] == [[21, 22], [31, 32]]
    assert [c.logprobs for c in capture.choices] == [[-21.0, -22.0], [-31.0, -32.0]]
    assert capture.complete


def test_assemble_reasoning_deltas() -> None:
    assembler = StreamAssembler(CHAT)
    assembler.add(_delta_chunk({"role": "assistant", "reasoning": "think "}))
    assembler.add(_delta_chunk({"reasoning_content": "more"}))
    assembler.add(_delta_chunk({"content": "answer"}, finish="stop"))

    [choice] = assembler.finish().choices

    assert choice.message == {
        "role": "assistant",
        "content": "answer",
        "reasoning": "think more",
    }


def test_assemble_completions_stream() -> None:
    assembler = StreamAssembler(COMPLETIONS)

    def chunk(text: str, tokens: list[int], **choice: Any) -> dict[str, Any]:
        logprobs = {"tokens": ["t"] * len(tokens), "token_logprobs": [-0.5] * len(tokens)}
        body = {"index": 0, "text": text, "logprobs": logprobs, "token_ids": tokens, **choice}
        return {"id": "c", "created": 1, "model": "m", "choices": [body]}

    assembler.add(chunk(" a", [5], prompt_token_ids=[1, 2], finish_reason=None))
    assembler.add(chunk(" b", [6, 7], finish_reason="length"))
    assembler.add(_usage_chunk(2, 3))

    assert assembler.response() == {
        "id": "c",
        "created": 1,
        "model": "m",
        "object": "text_completion",
        "choices": [{"index": 0, "text": " a b", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
    }
    assert assembler.capture.prompt_token_ids == [1, 2]
    assert assembler.capture.choices[0].logprobs == [-0.5, -0.5, -0.5]
    assert assembler.capture.complete


def test_assembled_stream_without_usage_has_no_usage_and_is_incomplete() -> None:
    assembler = StreamAssembler(CHAT)
    assembler.add(_delta_chunk({"content": "x"}, tokens=[4], prompt_token_ids=[1]))
    assembler.add(_delta_chunk({}, finish="stop"))

    assert "usage" not in assembler.response()
    assert not assembler.capture.complete
