"""Anthropic Messages API through the proxy, driven by the official anthropic SDK."""

from __future__ import annotations

import anthropic
import pytest

from tests.support.forcing import ADD_PARAMETERS, FORCE_CALL
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]

# a bounded schema, so the forced (named) tool call finishes in a few tokens
ADD_TOOL = {
    "name": "add",
    "description": "Add two small numbers.",
    "input_schema": ADD_PARAMETERS,
}


def client(proxy, session: str | None = None) -> anthropic.Anthropic:
    base = f"{proxy.url}/s/{session}" if session else proxy.url
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)


def test_create_and_stream_agree_and_are_recorded(proxy, vllm, engine, tokenizer):
    api = client(proxy)
    ask = {
        "model": vllm.model_name,
        "max_tokens": 16,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "Say something."}],
        "metadata": {"user_id": "u-1"},
        # SDK 2.x dropped sampling parameters from its signature; the API still takes them
        "extra_body": {"seed": 11, "temperature": 1.0, "top_k": 50},
    }
    whole = api.messages.create(**ask)
    assert whole.type == "message" and whole.role == "assistant"
    assert whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.output_tokens > 0 and whole.usage.input_tokens > 0
    with api.messages.stream(**ask) as stream:
        deltas = "".join(stream.text_stream)
        final = stream.get_final_message()
    # the SDK's own accumulator rebuilds the same answer as the non-streamed call
    assert [(b.type, b.text) for b in final.content] == [(b.type, b.text) for b in whole.content]
    assert deltas == "".join(b.text for b in whole.content if b.type == "text")
    assert (final.stop_reason, final.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.output_tokens,
    )

    wait_for_calls(engine, 2)
    calls = [c for t in export(engine) for c in t["calls"]]
    assert [c["api"] for c in calls] == ["messages", "messages"]
    for call in calls:
        assert call["capture_complete"] is True
        assert call["request"]["system"] == [{"type": "text", "text": "Be brief."}]
        assert call["response"]["type"] == "message"  # what the client got
        text = "".join(b["text"] for b in call["response"]["content"] if b["type"] == "text")
        decoded = tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True)
        assert decoded.rstrip("\ufffd") == text


def test_count_tokens_uses_vllms_tokenizer(proxy, vllm, tokenizer):
    messages = [{"role": "user", "content": "How many tokens is this?"}]
    counted = client(proxy).messages.count_tokens(model=vllm.model_name, messages=messages)
    expected = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert counted.input_tokens == len(expected)


def test_two_turn_tool_use_round_trip_is_one_trajectory(proxy, vllm, engine):
    api = client(proxy)
    messages: list = [{"role": "user", "content": "What is 1 + 2?"}]
    first = api.messages.create(
        model=vllm.model_name,
        max_tokens=80,
        tools=[ADD_TOOL],
        messages=messages,
        extra_body=FORCE_CALL,
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1, first
    (use,) = uses
    assert use.name == "add" and set(use.input) == {"a", "b"}
    assert first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "3"},
                {"type": "text", "text": "Thanks. And the answer?"},
            ],
        },
    ]
    second = api.messages.create(
        model=vllm.model_name, max_tokens=12, tools=[ADD_TOOL], messages=messages
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")

    wait_for_calls(engine, 2)
    (trajectory,) = export(engine)  # stitched across the two turns without a session key
    first_call, second_call = trajectory["calls"]
    assert first_call["capture_complete"] and second_call["capture_complete"]
    # the tool result reached the model as a tool message in the upstream prompt
    assert len(second_call["prompt_token_ids"]) > len(first_call["prompt_token_ids"])


def test_errors_are_in_anthropics_shape(proxy, vllm):
    api = client(proxy)
    with pytest.raises(anthropic.BadRequestError) as bad:
        api.messages.create(
            model=vllm.model_name,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                            },
                        }
                    ],
                }
            ],
        )
    assert bad.value.body["type"] == "error"
    assert "image" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        api.messages.create(
            model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.body["error"]["type"] == "not_found_error"
