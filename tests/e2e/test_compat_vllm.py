"""The compatibility policy end to end: the official SDKs, the proxy, the real vLLM server.

What the unit tests (tests/unit/proxy/api/translate/test_policy.py) show on the translation alone is
shown here on the wire: what the client gets, what vLLM was sent (the recorded prompt
tokens), and what the call's record says (`compat`, `user_agent`).
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from sqlalchemy import select

from proxy.api.translate.context_edits import CLEARED_RESULT
from store.models import Call
from tests.support.records import all_calls, wait_for_calls

pytestmark = [pytest.mark.vllm]

# a short answer the random model cannot avoid (vLLM structured outputs, passed through)
SHORT = {"structured_outputs": {"regex": "ok"}}
WRITE_TOOL = {
    "name": "Write",
    "description": "Writes a file.",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}


def claude(proxy: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0)


def codex(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)


def test_claude_code_fields_are_accepted_honoured_and_recorded(proxy, vllm, engine):
    """The fields Claude Code 2.1.332 sends, through the SDK: one answer, one record that
    says what the proxy did with each."""
    deferred = {**WRITE_TOOL, "name": "DeferredToolPlaceholder", "defer_loading": True}
    answer = claude(proxy).messages.create(
        model=vllm.model_name,
        max_tokens=16,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}],
        tools=[WRITE_TOOL, deferred],
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        extra_body={
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"},
            "speculative_new_field": {"on": True},
            **SHORT,
        },
    )
    assert [block.type for block in answer.content] == ["text"]
    assert answer.content[0].text == "ok"
    wait_for_calls(engine, 1)
    (call,) = all_calls(engine)
    assert call["capture_complete"] is True
    assert call["user_agent"].startswith("Anthropic/Python")
    assert call["compat"] == {
        "honoured": ["tools.defer_loading", "output_config.effort", "thinking"],
        "ignored": [
            "system.cache_control",
            "context_management.clear_thinking_20251015",
            "metadata",
            "thinking.display",
        ],
        "unknown": ["speculative_new_field"],
    }


def test_hosted_tools_are_left_out_and_recorded(proxy, vllm, engine):
    answer = codex(proxy).responses.create(
        model=vllm.model_name,
        input="hi",
        tools=[
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "web_search", "external_web_access": False},
        ],
        max_output_tokens=8,
        extra_body=SHORT,
    )
    assert answer.output_text == "ok"
    message = claude(proxy).messages.create(
        model=vllm.model_name,
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        tools=[WRITE_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        extra_body=SHORT,
    )
    assert message.content[0].text == "ok"
    wait_for_calls(engine, 2)
    left_out = {c["api"]: c["compat"]["left_out"] for c in all_calls(engine)}
    assert left_out == {"responses": ["web_search"], "messages": ["web_search_20250305"]}


def test_hosted_tools_are_refused_when_the_operator_says_so(vllm, db_url, engine, start_proxy):
    proxy = start_proxy([vllm.url], db_url, args=["--hosted-tools", "refuse"])
    with pytest.raises(openai.BadRequestError) as refused:
        codex(proxy).responses.create(
            model=vllm.model_name, input="hi", tools=[{"type": "web_search"}]
        )
    error = refused.value.response.json()["error"]  # the Responses API's own error shape
    assert (error["param"], error["type"]) == ("tools[0]", "invalid_request_error")
    assert "web_search" in error["message"]
    with pytest.raises(anthropic.BadRequestError) as refused_too:
        claude(proxy).messages.create(
            model=vllm.model_name,
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    body = refused_too.value.body  # Anthropic's error shape
    assert body["type"] == "error" and "tools.0.type" in body["error"]["message"]
    wait_for_calls(engine, 2)
    with engine.connect() as conn:  # refused calls belong to no trajectory
        refusals = dict(conn.execute(select(Call.api, Call.compat)).all())
    assert refusals["responses"]["refused"] == ["tools"]
    assert refusals["responses"]["detail"]["refused"]["param"] == "tools[0]"
    assert refusals["messages"]["refused"] == ["tools.type"]


def test_output_limits_larger_than_the_context_are_lowered_to_fit(proxy, vllm, engine):
    """The tiny model's context is 2,048 tokens: vLLM refuses 4,096 output tokens outright;
    the proxy asks vLLM how long the prompt is and sends what fits instead."""
    with claude(proxy).messages.stream(
        model=vllm.model_name,
        max_tokens=4096,
        messages=[{"role": "user", "content": "hi"}],
        extra_body=SHORT,
    ) as stream:
        message = stream.get_final_message()
    assert message.content[0].text == "ok"
    response = codex(proxy).responses.create(
        model=vllm.model_name, input="hi", max_output_tokens=5000, extra_body=SHORT
    )
    assert response.output_text == "ok"
    assert response.max_output_tokens == 5000  # what the client asked, echoed
    wait_for_calls(engine, 2)
    for call in all_calls(engine):
        limit = "max_tokens" if call["api"] == "messages" else "max_output_tokens"
        room = 2048 - len(call["prompt_token_ids"])
        assert call["compat"]["clamped"] == [limit]
        assert call["compat"]["detail"][limit] == {"asked": call["request"][limit], "sent": room}
        assert call["capture_complete"] is True


def test_old_tool_results_are_cleared_from_the_prompt_vllm_sees(proxy, vllm, engine, tokenizer):
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Write three files."}]
    for i, word in enumerate(("alpha", "bravo", "charlie")):
        use = {
            "type": "tool_use",
            "id": f"toolu_{i}",
            "name": "Write",
            "input": {"file_path": word},
        }
        # tool output is long; the placeholder that replaces it is short
        output = f"{word} done. " + "wrote 42 bytes. " * 20
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output}
        turns += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 50},
        "keep": {"type": "tool_uses", "value": 1},
    }
    message = claude(proxy).messages.create(
        model=vllm.model_name,
        max_tokens=8,
        messages=turns,
        tools=[WRITE_TOOL],
        extra_body={"context_management": {"edits": [edit]}, **SHORT},
    )
    applied = message.to_dict()["context_management"]["applied_edits"]
    assert [(e["type"], e["cleared_tool_uses"]) for e in applied] == [
        ("clear_tool_uses_20250919", 2)
    ]
    assert applied[0]["cleared_input_tokens"] > 0
    wait_for_calls(engine, 1)
    (call,) = all_calls(engine)
    seen = tokenizer.decode(call["prompt_token_ids"])
    assert "alpha done" not in seen and "bravo done" not in seen and "charlie done" in seen
    assert seen.count(CLEARED_RESULT) == 2
    detail = call["compat"]["detail"]["context_management.clear_tool_uses_20250919"]
    assert detail["cleared_tool_use_ids"] == ["toolu_0", "toolu_1"]
    assert detail["input_tokens"] - detail["cleared_input_tokens"] == len(call["prompt_token_ids"])
    assert call["request"]["messages"] == turns  # the record keeps what the client sent
