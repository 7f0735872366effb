"""Structured outputs reach vLLM: chat `response_format` and the Responses API `text.format`.

The schemas are tightly bounded (an enum) so the random tiny model, held to the schema by
vLLM's structured outputs, finishes within a few tokens.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.records import all_calls, wait_for_calls

pytestmark = [pytest.mark.vllm]

COLOURS = ["red", "green", "blue"]
SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": COLOURS}},
    "required": ["colour"],
    "additionalProperties": False,
}


@pytest.fixture
def api(vllm, db_url, engine, start_proxy) -> openai.OpenAI:
    proxy = start_proxy([vllm.url], db_url)
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def assert_conforms(answer: str) -> None:
    parsed = json.loads(answer)
    assert set(parsed) == {"colour"} and parsed["colour"] in COLOURS


def assert_recorded_token_complete(engine, tokenizer, answer: str) -> None:
    wait_for_calls(engine, 1)
    (call,) = all_calls(engine)
    assert call["status"] == "ok" and call["capture_complete"] is True
    assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
    decoded = tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True)
    assert decoded == answer


def test_chat_response_format_json_schema(api, vllm, engine, tokenizer):
    reply = api.chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "Pick a colour."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True},
        },
        max_tokens=200,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert_conforms(choice.message.content or "")
    assert_recorded_token_complete(engine, tokenizer, choice.message.content or "")


def test_responses_text_format_json_schema(api, vllm, engine, tokenizer):
    response = api.responses.create(
        model=vllm.model_name,
        input="Pick a colour.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": SCHEMA, "strict": True}},
        max_output_tokens=200,
    )
    assert response.status == "completed"
    assert_conforms(response.output_text)
    assert_recorded_token_complete(engine, tokenizer, response.output_text)
