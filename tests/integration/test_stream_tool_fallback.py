"""`--stream-tools-mode auto`: once an upstream is seen dropping the token ids of streamed
tool calls, later streaming requests with tools are answered from a whole upstream response
re-emitted as a stream, so their capture is complete again."""

from __future__ import annotations

import json
from pathlib import Path

import openai
from sqlalchemy import Engine

from tests.support.inprocess import BASE, in_process_client
from tests.support.records import all_calls, wait_for_calls
from tests.support.tool_dropping_upstream import (
    ARGUMENTS,
    PROMPT_IDS,
    TOKEN_IDS,
    ToolDroppingUpstream,
)

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
        ToolDroppingUpstream() as upstream,
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
