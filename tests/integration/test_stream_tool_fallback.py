"""`--stream-tools-mode auto`: once an upstream is seen dropping the token ids of streamed
tool calls, later streaming requests with tools are answered from a whole upstream response
re-emitted as a stream, so their capture is complete again.

The vLLM version the tests run does not have the bug the proxy works around, so the fake vLLM
(tests/support/fake_vllm.py) plays it: streamed tool calls whose chunks come without their
token ids (the tool parser swallows them), while usage still counts every sampled token;
whole (non-streaming) answers carry all of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
from sqlalchemy import Engine

from tests.support.fake_vllm import (
    FakeVLLM,
    Reply,
    Stream,
    Whole,
    completion,
    logprobs_of,
    usage_chunk,
)
from tests.support.fake_vllm import chunk as event
from tests.support.inprocess import BASE, in_process_client
from tests.support.records import all_calls, wait_for_calls

PROMPT_IDS = [1, 2, 3, 4]
# <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>
TOKEN_IDS = [201, 202, 203, 204, 205, 206, 207, 208]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0, -0.75, -0.0625, -0.3, -0.2]
ARGUMENTS = '{"a": 1, "b": 2}'
TEXT_IDS = [301, 302]  # an answer without tools: "Hi there"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]


def sampled(delta: dict[str, Any], ids: list[int], finish: str | None = None) -> dict[str, Any]:
    """A chunk with the ids of the tokens it was sampled from, and their logprobs."""
    logprobs = logprobs_of([f"t{i}" for i in ids], LOGPROBS[: len(ids)])
    return event(delta, token_ids=ids, logprobs=logprobs, finish=finish)


def dropping_tool_tokens(body: dict[str, Any]) -> Reply:
    """The buggy upstream: a streamed tool call's chunks carry only the last token's id;
    usage counts all of them. A stream without tools, and whole answers, are whole."""
    if not body.get("stream"):
        function = {"name": "add", "arguments": ARGUMENTS}
        call = {"id": "call_1", "type": "function", "function": function}
        return Whole(
            completion(
                {"role": "assistant", "content": None, "tool_calls": [call]},
                token_ids=TOKEN_IDS,
                logprobs=logprobs_of([f"t{i}" for i in TOKEN_IDS], LOGPROBS),
                prompt_ids=PROMPT_IDS,
                counts=(len(PROMPT_IDS), len(TOKEN_IDS)),
                finish="tool_calls",
            )
        )
    first = event({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT_IDS)
    if not body.get("tools"):
        hi, there = TEXT_IDS[:1], TEXT_IDS[1:]
        return Stream(
            [
                first,
                sampled({"content": "Hi"}, hi),
                sampled({"content": " there"}, there, finish="stop"),
                usage_chunk(len(PROMPT_IDS), len(TEXT_IDS)),
            ]
        )
    name = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add"}}
    arguments = {"index": 0, "function": {"arguments": ARGUMENTS}}
    return Stream(
        [
            first,
            event({"tool_calls": [name]}),
            event({"tool_calls": [arguments]}),
            sampled({}, TOKEN_IDS[-1:], finish="tool_calls"),
            usage_chunk(len(PROMPT_IDS), len(TOKEN_IDS)),
        ]
    )


def streamed_tool_call(api: openai.OpenAI, question: str) -> tuple[str, str, str | None]:
    """(name, arguments, finish reason) as the SDK reads them from a streamed answer."""
    name, arguments, finish = "", "", None
    stream = api.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": question}],
        tools=TOOLS,
        stream=True,
    )
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                if call.function is not None:
                    name += call.function.name or ""
                    arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return name, arguments, finish


def test_dropped_tool_tokens_switch_streaming_tool_calls_to_whole_upstream_answers(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    # the app in-process (tests/support/inprocess.py); --stream-tools-mode auto, the default
    with (
        FakeVLLM(dropping_tool_tokens) as upstream,
        in_process_client(
            upstreams=[upstream.url], database_url=db_url, spool_path=tmp_path / "s.jsonl"
        ) as proxy,
    ):
        api = openai.OpenAI(base_url=BASE + "/v1", api_key="x", max_retries=0, http_client=proxy)

        # first: streamed through as it comes; the upstream loses tool-call token ids
        assert streamed_tool_call(api, "first") == ("add", ARGUMENTS, "tool_calls")
        assert upstream.requests[-1]["stream"] is True
        wait_for_calls(engine, 1)
        (dropped,) = all_calls(engine)
        assert dropped["capture_complete"] is False
        assert dropped["completion_token_ids"] == TOKEN_IDS[-1:]

        # then: asked upstream without streaming, re-emitted to the client as a stream
        assert streamed_tool_call(api, "second") == ("add", ARGUMENTS, "tool_calls")
        assert upstream.requests[-1]["stream"] is False
        # a streaming request without tools is still streamed upstream
        texts = api.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "third"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in texts if c.choices) == "Hi there"
        assert upstream.requests[-1]["stream"] is True

    wait_for_calls(engine, 3)
    by_question = {c["request"]["messages"][0]["content"]: c for c in all_calls(engine)}
    buffered = by_question["second"]
    assert buffered["stream"] is True and buffered["status"] == "ok"
    assert buffered["capture_complete"] is True
    assert buffered["prompt_token_ids"] == PROMPT_IDS
    assert buffered["completion_token_ids"] == TOKEN_IDS
    assert len(buffered["completion_logprobs"]) == len(TOKEN_IDS)
    (call,) = buffered["response"]["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": ARGUMENTS}
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
