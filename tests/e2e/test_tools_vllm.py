"""Tool calls through the proxy (the tiny model is forced to emit one with a regex)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.forcing import FORCE_CALL
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def ask(api: openai.OpenAI, model: str, messages: list, stream: bool):
    return api.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        max_tokens=60,
        stream=stream,
        extra_body=FORCE_CALL,
    )


def streamed_tool_call(stream) -> tuple[str, str, str | None]:
    name, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return name, arguments, finish


@pytest.mark.parametrize("mode", ["auto", "buffer"])
def test_tool_call_round_trip_is_one_complete_trajectory(
    vllm, db_url, engine, start_proxy, tokenizer, mode
):
    proxy = start_proxy([vllm.url], db_url, args=["--stream-tools-mode", mode])
    api = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    messages: list = [{"role": "user", "content": "what is 1 + 2?"}]

    reply = ask(api, vllm.model_name, messages, stream=False)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert reply.choices[0].finish_reason == "tool_calls"

    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    name, arguments, finish = streamed_tool_call(ask(api, vllm.model_name, messages, True))
    assert (name, json.loads(arguments), finish) == ("add", {"a": 1, "b": 2}, "tool_calls")

    wait_for_calls(engine, 2)
    (trajectory,) = export(engine)  # stitched: the second call continues the first
    first, second = trajectory["calls"]
    for recorded in (first, second):
        assert recorded["capture_complete"] is True
        assert "<tool_call>" in tokenizer.decode(recorded["completion_token_ids"])
    assert second["stream"] is True
    tool_calls = second["response"]["choices"][0]["message"]["tool_calls"]
    assert tool_calls[0]["function"]["name"] == "add"
