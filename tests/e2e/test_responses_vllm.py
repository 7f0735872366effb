"""OpenAI Responses API through the proxy, driven by the official openai SDK."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.forcing import ADD_PARAMETERS, FORCE_CALL
from tests.support.records import all_calls, export, wait_for_calls

pytestmark = [pytest.mark.vllm]

ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two small numbers.",
    "parameters": ADD_PARAMETERS,
}


def client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def test_create_and_stream_agree_and_are_recorded(proxy, vllm, engine, tokenizer):
    api = client(proxy)
    ask = {
        "model": vllm.model_name,
        "input": "Say something.",
        "instructions": "Be brief.",
        "max_output_tokens": 16,
        "temperature": 1.0,
        "extra_body": {"seed": 5},
    }
    whole = api.responses.create(**ask)
    assert whole.object == "response" and whole.status in ("completed", "incomplete")
    with api.responses.stream(**ask) as stream:
        events = list(stream)  # the SDK's own stream state parses and accumulates them
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    # max_output_tokens usually ends the tiny model's answer: response.incomplete, which
    # the SDK's get_final_response() (completed only) does not accept
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    assert final.status == whole.status
    assert final.output_text == whole.output_text == deltas
    assert final.usage.output_tokens == whole.usage.output_tokens
    raw_events = [e.type for e in api.responses.create(**ask, stream=True)]
    assert raw_events[0] == "response.created" and raw_events[-1] in (
        "response.completed",
        "response.incomplete",
    )

    wait_for_calls(engine, 3)
    calls = [c for t in export(engine) for c in t["calls"]]
    assert {c["api"] for c in calls} == {"responses"}
    for call in calls:
        assert call["capture_complete"] is True
        assert call["response"]["object"] == "response"
        decoded = tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True)
        assert decoded.rstrip("\ufffd") == whole.output_text


def test_function_call_round_trip_and_previous_response_id(proxy, vllm, engine):
    api = client(proxy)
    first = api.responses.create(
        model=vllm.model_name,
        input="What is 1 + 2?",
        tools=[ADD_TOOL],
        max_output_tokens=60,
        extra_body=FORCE_CALL,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "add" and set(json.loads(call.arguments)) == {"a", "b"}
    # the follow-up sends only the tool output: the rest comes from the stored response
    second = api.responses.create(
        model=vllm.model_name,
        previous_response_id=first.id,
        tools=[ADD_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "3"}],
        max_output_tokens=12,
    )
    assert second.previous_response_id == first.id
    assert api.responses.retrieve(first.id).id == first.id

    wait_for_calls(engine, 2)
    (trajectory,) = export(engine)  # stitched: the second call continues the first
    first_call, second_call = trajectory["calls"]
    assert all(c["capture_complete"] for c in (first_call, second_call))
    prompt = second_call["prompt_token_ids"]
    assert prompt[: len(first_call["prompt_token_ids"])] == first_call["prompt_token_ids"]


def test_unknown_previous_and_stored_responses_are_not_found(proxy, vllm):
    api = client(proxy)
    with pytest.raises(openai.NotFoundError):
        api.responses.create(model=vllm.model_name, input="hi", previous_response_id="resp_x")
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve("resp_missing")


def test_stored_responses_outlive_a_proxy_restart_and_unstored_ones_are_refused(
    vllm, db_url, engine, start_proxy, tokenizer
):
    before = start_proxy([vllm.url], db_url)
    api = client(before)
    ask = {"model": vllm.model_name, "max_output_tokens": 8, "temperature": 1.0}
    kept = api.responses.create(input="Say something.", **ask)
    unkept = api.responses.create(input="Say something else.", store=False, **ask)
    wait_for_calls(engine, 2)
    before.stop()

    # a fresh process on the same database: nothing in memory, only what was written
    after = start_proxy([vllm.url], db_url)
    api = client(after)
    assert api.responses.retrieve(kept.id).model_dump() == kept.model_dump()
    follow_up = api.responses.create(previous_response_id=kept.id, input="Go on.", **ask)
    assert follow_up.previous_response_id == kept.id

    for refused in (
        lambda: api.responses.retrieve(unkept.id),
        lambda: api.responses.create(previous_response_id=unkept.id, input="Go on.", **ask),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            refused()
        error = missing.value.response.json()["error"]  # the Responses API's error shape
        assert set(error) == {"message", "type", "param", "code"}
        assert unkept.id in error["message"] and error["type"] == "invalid_request_error"

    wait_for_calls(engine, 3, status="ok")
    calls = {c["response"]["id"]: c for c in all_calls(engine) if c["status"] == "ok"}
    first, continued = calls[kept.id], calls[follow_up.id]
    assert continued["capture_complete"] is True
    # the follow-up's prompt is the stored conversation: the first prompt, then its answer
    prompt = continued["prompt_token_ids"]
    assert prompt[: len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    assert kept.output_text in tokenizer.decode(prompt[len(first["prompt_token_ids"]) :])
