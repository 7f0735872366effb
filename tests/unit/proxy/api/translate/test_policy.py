"""The compatibility policy of the Messages and Responses translations: one test per row of
the policy table of docs/harnesses.md ("Compatibility policy"), each checking both what reaches the
chat request and what the call's record says (`Compat`).

The request fields are the ones Claude Code 2.1.332 and Codex CLI 0.171.0 send (captured
from the real CLIs), plus fields no client sends yet, to show the rule holds for them too.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.api.translate import context_edits
from proxy.api.translate import messages as anthropic
from proxy.api.translate import responses as openai_responses
from proxy.base.compat_policy import Compat, feature_name, fitting_output_limit

EVENTS = TypeAdapter(ResponseStreamEvent)
WRITE_TOOL = {
    "name": "Write",
    "description": "Writes a file.",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
        {"type": "function", "name": "close_agent", "parameters": {"type": "object"}},
    ],
}


def _messages(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 32000,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def _to_chat(body: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    compat = Compat()
    chat = anthropic.messages_to_chat(body, compat=compat, **kwargs)
    return chat, compat.as_record() or {}


def _responses_to_chat(
    body: dict[str, Any], **kwargs: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    compat = Compat()
    chat = openai_responses.responses_to_chat({"model": "m", **body}, compat=compat, **kwargs)
    return chat, compat.as_record() or {}


# --- accepted, recorded, not forwarded ----------------------------------------------------


def test_messages_vendor_fields_are_recorded_and_not_forwarded() -> None:
    cached = {"type": "ephemeral"}
    body = _messages(
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        cache_control=cached,
        service_tier="auto",
        speed="standard",
        inference_geo="us",
        container="cntr_1",
        system=[{"type": "text", "text": "Be brief.", "cache_control": cached}],
        tools=[{**WRITE_TOOL, "cache_control": cached, "eager_input_streaming": True}],
        thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
    )
    chat, record = _to_chat(body)
    plain, _ = _to_chat(
        _messages(system="Be brief.", tools=[WRITE_TOOL], thinking=body["thinking"])
    )
    assert chat == {**plain, "user": body["metadata"]["user_id"]}  # chat's user: vLLM ignores it
    assert record["ignored"] == [
        "cache_control",
        "service_tier",
        "speed",
        "inference_geo",
        "container",
        "system.cache_control",
        "tools.cache_control",
        "tools.eager_input_streaming",
        "metadata",
        "thinking.budget_tokens",
        "thinking.display",
    ]


def test_responses_vendor_fields_are_recorded_and_not_forwarded() -> None:
    body = {
        "input": "hi",
        "store": False,
        "include": ["reasoning.encrypted_content", "web_search_call.action.sources"],
        "prompt_cache_key": "01a230e9",
        "client_metadata": {"x-codex-turn-metadata": "{}"},
        "metadata": {"k": "v"},
        "service_tier": "flex",
        "truncation": "auto",
        "max_tool_calls": 3,
        "stream_options": {"include_obfuscation": False},
        "context_management": [{"type": "compaction", "compact_threshold": 200000}],
        "reasoning": {"summary": "auto"},
        "text": {"verbosity": "low"},
    }
    chat, record = _responses_to_chat(body)
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert record == {
        "ignored": [
            "prompt_cache_key",
            "client_metadata",
            "metadata",
            "service_tier",
            "truncation",
            "max_tool_calls",
            "stream_options",
            "context_management",
            "reasoning.summary",
            "text.verbosity",
            "include.reasoning.encrypted_content",
            "include.web_search_call.action.sources",
        ]
    }


def test_context_edit_that_keeps_everything_changes_nothing() -> None:
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    thought = {"type": "thinking", "thinking": "old thought", "signature": ""}
    turns = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [thought, {"type": "text", "text": "a"}]},
        {"role": "user", "content": "q2"},
    ]
    chat, record = _to_chat(_messages(messages=turns, context_management=edits))
    assert chat == _to_chat(_messages(messages=turns))[0]
    assert chat["messages"][1]["reasoning"] == "old thought"
    assert record["ignored"] == ["context_management.clear_thinking_20251015"]


_TEXT = {"type": "text", "text": "x"}


@pytest.mark.parametrize(
    ("translate", "body", "plain", "field"),
    [
        (_to_chat, _messages(priority_hint="high"), _messages(), "priority_hint"),
        (
            _to_chat,
            _messages(output_config={"effort": "low", "task_budget": 5}),
            _messages(output_config={"effort": "low"}),
            "output_config.task_budget",
        ),
        (
            _to_chat,
            _messages(tools=[{**WRITE_TOOL, "rank": 1}]),
            _messages(tools=[WRITE_TOOL]),
            "tools.rank",
        ),
        (
            _to_chat,
            _messages(messages=[{"role": "user", "content": [{**_TEXT, "lang": "en"}]}]),
            _messages(messages=[{"role": "user", "content": [_TEXT]}]),
            "messages.content.lang",
        ),
        (
            _responses_to_chat,
            {"input": "hi", "priority_hint": "high"},
            {"input": "hi"},
            "priority_hint",
        ),
        (
            _responses_to_chat,
            {"input": "hi", "include": ["new.thing"]},
            {"input": "hi"},
            "include.new.thing",
        ),
        (
            _responses_to_chat,
            {"input": "hi", "reasoning": {"effort": "low", "depth": 2}},
            {"input": "hi", "reasoning": {"effort": "low"}},
            "reasoning.depth",
        ),
    ],
)
def test_fields_not_seen_yet_are_accepted_recorded_as_unknown_and_not_forwarded(
    translate: Any, body: dict[str, Any], plain: dict[str, Any], field: str
) -> None:
    chat, record = translate(body)
    assert record["unknown"] == [field]
    assert chat == translate(plain)[0]


# --- honoured -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("thinking", "enabled"),
    [
        ({"type": "adaptive", "display": "omitted"}, True),  # what Claude Code sends
        ({"type": "enabled", "budget_tokens": 2048}, True),
        ({"type": "disabled"}, False),
    ],
)
def test_thinking_switches_the_templates_reasoning_mode(
    thinking: dict[str, Any], enabled: bool
) -> None:
    chat, record = _to_chat(_messages(thinking=thinking))
    assert chat["chat_template_kwargs"] == {"enable_thinking": enabled}
    assert record["honoured"] == ["thinking"]
    # the client's own template switch wins
    chat, _ = _to_chat(_messages(thinking=thinking, chat_template_kwargs={"enable_thinking": 0}))
    assert chat["chat_template_kwargs"] == {"enable_thinking": 0}


def test_effort_hints_become_vllms_reasoning_effort() -> None:
    chat, record = _to_chat(_messages(output_config={"effort": "high"}))
    assert chat["reasoning_effort"] == "high"
    assert record["honoured"] == ["output_config.effort"]
    chat, record = _responses_to_chat({"input": "hi", "reasoning": {"effort": "low"}})
    assert chat["reasoning_effort"] == "low"
    assert record["honoured"] == ["reasoning.effort"]


def test_clearing_old_thinking_is_carried_out_on_the_prompt() -> None:
    def turn(thought: str) -> dict[str, Any]:
        block = {"type": "thinking", "thinking": thought, "signature": ""}
        return {"role": "assistant", "content": [block, {"type": "text", "text": "a"}]}

    turns = [{"role": "user", "content": "q"}, turn("one"), {"role": "user", "content": "q"}]
    turns += [turn("two"), {"role": "user", "content": "q"}, turn("three")]
    turns.append({"role": "user", "content": "q"})
    keep = {"type": "thinking_turns", "value": 2}
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    chat, record = _to_chat(_messages(messages=turns, context_management=edits))
    kept = [m.get("reasoning") for m in chat["messages"] if m["role"] == "assistant"]
    assert kept == [None, "two", "three"]
    assert record["honoured"] == ["context_management.clear_thinking_20251015"]


def test_clearing_old_tool_results_replaces_them_once_triggered() -> None:
    def call(i: int, name: str = "Read") -> list[dict[str, Any]]:
        use = {"type": "tool_use", "id": f"t{i}", "name": name, "input": {"i": i}}
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"result {i}"}
        return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]

    turns = [{"role": "user", "content": "go"}, *call(1), *call(2, "Memory"), *call(3), *call(4)]
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 500},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["Memory"],
        "clear_tool_inputs": True,
    }
    body = _messages(messages=turns, context_management={"edits": [edit]})
    chat, record = _to_chat(body)
    assert record["honoured"] == ["context_management.clear_tool_uses_20250919"]
    clearing = anthropic.tool_use_clearing(body)
    assert clearing is not None
    assert not clearing.triggered(prompt_tokens=500, tool_uses=4)
    assert clearing.triggered(prompt_tokens=501, tool_uses=4)
    edited, cleared = context_edits.clear_tool_uses(chat["messages"], clearing)
    assert cleared == ["t1", "t3"]  # the newest stays, Memory is excluded
    results = {m["tool_call_id"]: m["content"] for m in edited if m["role"] == "tool"}
    assert results == {
        "t1": context_edits.CLEARED_RESULT,
        "t2": "result 2",
        "t3": context_edits.CLEARED_RESULT,
        "t4": "result 4",
    }
    arguments = [m["tool_calls"][0]["function"]["arguments"] for m in edited if m.get("tool_calls")]
    assert arguments == ["{}", '{"i": 2}', "{}", '{"i": 4}']
    assert chat["messages"][2]["content"] == "result 1"  # the client's conversation is untouched


def test_tool_use_trigger_may_count_tool_uses() -> None:
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 2}}
    clearing = anthropic.tool_use_clearing(_messages(context_management={"edits": [edit]}))
    assert clearing is not None
    assert (clearing.triggered(prompt_tokens=None, tool_uses=2), clearing.keep) == (False, 3)
    assert clearing.triggered(prompt_tokens=None, tool_uses=3)


def test_deferred_tools_are_not_shown_until_loaded() -> None:
    placeholder = {
        "name": "DeferredToolPlaceholder",
        "description": "Reserved placeholder; never call this tool.",
        "input_schema": {"type": "object", "properties": {}},
        "defer_loading": True,
    }
    chat, record = _to_chat(_messages(tools=[WRITE_TOOL, placeholder]))
    assert [t["function"]["name"] for t in chat["tools"]] == ["Write"]
    assert record["honoured"] == ["tools.defer_loading"]


def test_tool_input_examples_are_shown_in_the_description() -> None:
    tool = {**WRITE_TOOL, "input_examples": [{"file_path": "/tmp/a"}]}
    chat, record = _to_chat(_messages(tools=[tool]))
    assert chat["tools"][0]["function"]["description"] == (
        'Writes a file.\n\nInput examples:\n{"file_path": "/tmp/a"}'
    )
    assert record["honoured"] == ["tools.input_examples"]


def test_developer_messages_become_system_messages() -> None:
    developer = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "rules"}],
    }
    chat, record = _responses_to_chat({"input": [developer, {"role": "user", "content": "hi"}]})
    assert chat["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi"},
    ]
    assert record["honoured"] == ["input.developer"]


# --- namespace tools ----------------------------------------------------------------------


def test_namespace_tools_are_flattened_into_functions() -> None:
    chat, record = _responses_to_chat({"input": "hi", "tools": [EXEC, AGENTS]})
    assert [t["function"]["name"] for t in chat["tools"]] == [
        "exec_command",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__close_agent",
    ]
    assert chat["tools"][1]["function"]["parameters"] == {"type": "object"}
    assert record["flattened"] == ["multi_agent_v1"]
    assert openai_responses.flat_tool_name("mcp__calendar__", "__create") == "mcp__calendar__create"


def _flat_call(arguments: str = '{"target": "a1"}') -> dict[str, Any]:
    return {
        "id": "call_9",
        "type": "function",
        "function": {"name": "multi_agent_v1__close_agent", "arguments": arguments},
    }


def test_a_call_to_a_flattened_tool_is_mapped_back_to_its_namespace() -> None:
    request = {"model": "m", "input": "hi", "tools": [EXEC, AGENTS]}
    chat = {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "tool_calls": [_flat_call()]},
                "finish_reason": "tool_calls",
            }
        ],
    }
    response = openai_responses.chat_to_response(
        chat, request=request, response_id="resp_1", created_at=1
    )
    (item,) = response["output"]
    assert (item["namespace"], item["name"], item["call_id"]) == (
        "multi_agent_v1",
        "close_agent",
        "call_9",
    )
    assert Response.model_validate(response).output[0].name == "close_agent"
    # echoed back as the next request's input, it is the flat call the model made
    echoed = openai_responses.items_to_messages([item])
    assert echoed[0]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"


def test_a_streamed_call_to_a_flattened_tool_is_mapped_back_to_its_namespace() -> None:
    request = {"model": "m", "input": "hi", "tools": [AGENTS]}
    stream = openai_responses.ResponsesStream(request=request, response_id="resp_1", created_at=1)
    first = {
        "index": 0,
        "id": "call_9",
        "type": "function",
        "function": {"name": "multi_agent_v1__close_agent", "arguments": ""},
    }
    rest = {"index": 0, "function": {"arguments": '{"target": "a1"}'}}
    chunks = [
        {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [first]}}]},
        {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [rest]}}]},
        {
            "id": "c",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        },
    ]
    events = [e for chunk in chunks for e in stream.feed(chunk)] + stream.finish()
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert (added["item"]["namespace"], added["item"]["name"]) == ("multi_agent_v1", "close_agent")
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(EVENTS.validate_python(event))
    (item,) = stream.response["output"]
    assert (item["namespace"], item["name"], item["arguments"]) == (
        "multi_agent_v1",
        "close_agent",
        '{"target": "a1"}',
    )


def test_tool_choice_may_name_a_namespaced_function() -> None:
    choice = {"type": "function", "namespace": "multi_agent_v1", "name": "close_agent"}
    chat, _ = _responses_to_chat({"input": "hi", "tools": [AGENTS], "tool_choice": choice})
    assert chat["tool_choice"] == {
        "type": "function",
        "function": {"name": "multi_agent_v1__close_agent"},
    }


def test_flattened_names_that_collide_are_refused() -> None:
    clash = {"type": "function", "name": "multi_agent_v1__close_agent"}
    with pytest.raises(openai_responses.TranslationError) as caught:
        _responses_to_chat({"input": "hi", "tools": [AGENTS, clash]})
    assert caught.value.param == "tools"


# --- hosted tools -------------------------------------------------------------------------


def test_messages_tools_the_model_cannot_be_given_are_left_out_and_recorded() -> None:
    tools = [
        WRITE_TOOL,
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "code_execution_20250825", "name": "code_execution"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1},
    ]
    servers = [{"type": "url", "url": "https://mcp.example", "name": "docs"}]
    chat, record = _to_chat(_messages(tools=tools, mcp_servers=servers))
    assert [t["function"]["name"] for t in chat["tools"]] == ["Write"]
    assert record["left_out"] == [
        "mcp_servers",
        "web_search_20250305",
        "code_execution_20250825",
        "computer_20250124",
    ]
    with pytest.raises(anthropic.TranslationError) as caught:
        _to_chat(_messages(tools=tools), hosted_tools="refuse")
    assert caught.value.param == "tools.1.type"


def test_responses_tools_the_model_cannot_be_given_are_left_out_and_recorded() -> None:
    web = {"type": "web_search", "external_web_access": False}  # what Codex sends
    tools = [
        EXEC,
        web,
        {"type": "file_search", "vector_store_ids": ["v"]},
        {"type": "mcp", "server_label": "x"},
    ]
    chat, record = _responses_to_chat({"input": "hi", "tools": tools, "tool_choice": "auto"})
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command"]
    assert chat["tool_choice"] == "auto"
    assert record["left_out"] == ["web_search", "file_search", "mcp"]
    # with only hosted tools, no tools and no choice reach vLLM (it refuses a choice alone)
    chat, _ = _responses_to_chat({"input": "hi", "tools": [web], "tool_choice": "auto"})
    assert "tools" not in chat and "tool_choice" not in chat
    with pytest.raises(openai_responses.TranslationError) as caught:
        _responses_to_chat({"input": "hi", "tools": tools}, hosted_tools="refuse")
    assert caught.value.param == "tools[1]"


@pytest.mark.parametrize(
    ("translate", "body", "param"),
    [
        (
            _to_chat,
            _messages(
                tools=[WRITE_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
                tool_choice={"type": "tool", "name": "web_search"},
            ),
            "tool_choice.name",
        ),
        (
            _responses_to_chat,
            {
                "input": "hi",
                "tools": [EXEC, {"type": "web_search"}],
                "tool_choice": {"type": "web_search"},
            },
            "tool_choice",
        ),
        (
            _responses_to_chat,
            {"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "required"},
            "tool_choice",
        ),
    ],
)
def test_forcing_a_tool_the_model_is_not_given_is_refused(
    translate: Any, body: dict[str, Any], param: str
) -> None:
    with pytest.raises((anthropic.TranslationError, openai_responses.TranslationError)) as caught:
        translate(body)
    assert caught.value.param == param


# --- oversized output limits ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "prompt", "context", "sent"),
    [
        (32000, 31684, 65536, None),  # Claude Code's limit and prompt on a 64k model: fits
        (32000, 40000, 65536, 25536),
        (32000, 100, 16384, 16284),
        (100, 65535, 65536, 1),
        (100, 65536, 65536, None),  # nothing fits: vLLM's own refusal tells the client
    ],
)
def test_an_output_limit_larger_than_the_room_left_is_lowered_to_fit(
    asked: int, prompt: int, context: int, sent: int | None
) -> None:
    assert fitting_output_limit(asked, prompt_tokens=prompt, context=context) == sent


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("translate", "body", "param"),
    [
        (
            _to_chat,
            _messages(messages=[{"role": "user", "content": [{"type": "image"}]}]),
            "messages.0.content.0.type",
        ),
        (
            _to_chat,
            _messages(messages=[{"role": "user", "content": [{"type": "hologram"}]}]),
            "messages.0.content.0.type",
        ),
        (_responses_to_chat, {"input": [{"type": "hologram_call"}]}, "input[0]"),
        (_responses_to_chat, {"input": "hi", "background": True}, "background"),
        (_responses_to_chat, {"input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
    ],
)
def test_what_would_change_the_task_is_refused_naming_it(
    translate: Any, body: dict[str, Any], param: str
) -> None:
    with pytest.raises((anthropic.TranslationError, openai_responses.TranslationError)) as caught:
        translate(body)
    assert caught.value.param == param


def test_feature_names_drop_list_indices() -> None:
    assert feature_name("tools.3.cache_control") == "tools.cache_control"
    assert feature_name("input[2].content[0]") == "input.content"
    assert (
        feature_name("include.reasoning.encrypted_content") == "include.reasoning.encrypted_content"
    )
