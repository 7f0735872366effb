"""proxy.api.translate.messages: Anthropic Messages <-> chat completions.

Hand-written inputs and expected outputs for each mapping, plus proof that the official
`anthropic` SDK accepts what we emit: stream events go through the SDK's own SSE decoder,
strict event models and `accumulate_event`; responses validate as `anthropic.types.Message`;
and one round trip each through a real SDK client over an in-process transport.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import anthropic
import pytest
from anthropic._streaming import SSEDecoder
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from proxy.api.translate.messages import (
    MessagesStream,
    TranslationError,
    chat_to_message,
    count_tokens_chat_body,
    error_body,
    messages_to_chat,
)

httpx2 = pytest.importorskip("httpx2")  # the HTTP client the anthropic SDK 2.x is built on

EVENT = TypeAdapter(RawMessageStreamEvent)
Event = tuple[str, dict[str, Any]]


def _body(*turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    messages = list(turns) or [{"role": "user", "content": "hi"}]
    return {"model": "claude-x", "max_tokens": 64, "messages": messages, **extra}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


WEATHER_TOOL = {
    "name": "weather",
    "description": "Weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_FUNCTION = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather for a city.",
        "parameters": WEATHER_TOOL["input_schema"],
    },
}


# --- messages_to_chat: mappings ----------------------------------------------------------


def test_minimal_request() -> None:
    assert messages_to_chat(_body()) == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
    }


def test_sampling_and_metadata_fields() -> None:
    body = _body(
        stop_sequences=["###", "END"],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
        stream=True,
    )
    chat = messages_to_chat(body)
    assert chat["stop"] == ["###", "END"]
    assert (chat["temperature"], chat["top_p"], chat["top_k"]) == (0.5, 0.9, 40)
    assert chat["user"] == "u-1"
    assert chat["stream"] is True


def test_stream_false_and_empty_stop_sequences() -> None:
    chat = messages_to_chat(_body(stream=False, stop_sequences=[], metadata={}))
    assert chat["stream"] is False
    assert "stop" not in chat and "user" not in chat


@pytest.mark.parametrize(
    ("system", "text"),
    [
        ("Be brief.", "Be brief."),
        (
            [
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be kind."},
            ],
            "Be brief.\nBe kind.",
        ),
    ],
)
def test_system_becomes_leading_system_message(system: Any, text: str) -> None:
    chat = messages_to_chat(_body(system=system))
    assert chat["messages"] == [
        {"role": "system", "content": text},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize("system", ["", []])
def test_empty_system_means_none(system: Any) -> None:
    assert messages_to_chat(_body(system=system))["messages"] == [{"role": "user", "content": "hi"}]


def test_text_blocks_join_and_cache_control_is_ignored() -> None:
    turn = _user(
        [
            {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "two", "citations": None},
        ]
    )
    assert messages_to_chat(_body(turn))["messages"] == [{"role": "user", "content": "one\ntwo"}]


def test_tool_use_and_tool_result_round() -> None:
    body = _body(
        _user("Weather in Zürich and Paris?"),
        _assistant(
            [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Zürich"}},
                {"type": "tool_use", "id": "t2", "name": "weather", "input": {"city": "Paris"}},
            ]
        ),
        _user(
            [
                {"type": "tool_result", "tool_use_id": "t1", "content": "3°C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "9C"}],
                },
                {"type": "text", "text": "Thanks, and tomorrow?"},
            ]
        ),
    )
    assert messages_to_chat(body)["messages"] == [
        {"role": "user", "content": "Weather in Zürich and Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    # not \u00fc-escaped: vLLM's tool parsers write it this way too
                    "function": {"name": "weather", "arguments": '{"city": "Zürich"}'},
                },
                {
                    "id": "t2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "3°C"},
        {"role": "tool", "tool_call_id": "t2", "content": "rain\n9C"},
        {"role": "user", "content": "Thanks, and tomorrow?"},
    ]


def test_tool_only_assistant_turn_has_no_content() -> None:
    turn = _assistant([{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}])
    message = messages_to_chat(_body(_user("hi"), turn, _user("go on")))["messages"][1]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"


def test_tool_result_error_and_empty_content() -> None:
    turn = _user(
        [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": "no such city",
                "is_error": True,
            },
            {"type": "tool_result", "tool_use_id": "t2"},
            {"type": "tool_result", "tool_use_id": "t3", "is_error": False, "content": []},
        ]
    )
    assert messages_to_chat(_body(turn))["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": "Error: no such city"},
        {"role": "tool", "tool_call_id": "t2", "content": ""},
        {"role": "tool", "tool_call_id": "t3", "content": ""},
    ]


def test_block_order_is_preserved_around_tool_results() -> None:
    turn = _user(
        [
            {"type": "text", "text": "before"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "r1"},
            {"type": "text", "text": "between"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "r2"},
        ]
    )
    assert [(m["role"], m["content"]) for m in messages_to_chat(_body(turn))["messages"]] == [
        ("user", "before"),
        ("tool", "r1"),
        ("user", "between"),
        ("tool", "r2"),
    ]


def test_empty_user_turn_stays_a_turn() -> None:
    assert messages_to_chat(_body(_user([])))["messages"] == [{"role": "user", "content": ""}]


def test_thinking_block_becomes_reasoning() -> None:
    turn = _assistant(
        [
            {"type": "thinking", "thinking": "2+2 is 4", "signature": ""},
            {"type": "text", "text": "4"},
        ]
    )
    message = messages_to_chat(_body(_user("2+2?"), turn, _user("and 3+3?")))["messages"][1]
    assert message == {"role": "assistant", "content": "4", "reasoning": "2+2 is 4"}


def test_inline_system_turn_keeps_its_place() -> None:
    body = _body(_user("hi"), {"role": "system", "content": "Reminder."}, _user("go"))
    assert [m["role"] for m in messages_to_chat(body)["messages"]] == ["user", "system", "user"]


def test_final_assistant_turn_is_a_prefill() -> None:
    chat = messages_to_chat(_body(_user("Pick A or B"), _assistant("The answer is (")))
    assert chat["messages"][-1] == {"role": "assistant", "content": "The answer is ("}
    assert chat["add_generation_prompt"] is False
    assert chat["continue_final_message"] is True
    assert "continue_final_message" not in messages_to_chat(_body())


def test_tools_map_to_functions() -> None:
    tool = {
        **WEATHER_TOOL,
        "type": "custom",
        "strict": True,
        "cache_control": {"type": "ephemeral"},
    }
    bare = {"name": "now", "input_schema": {"type": "object"}}
    chat = messages_to_chat(_body(tools=[tool, bare]))
    assert chat["tools"] == [
        {"type": "function", "function": {**WEATHER_FUNCTION["function"], "strict": True}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
    ]
    assert "tool_choice" not in chat  # vLLM defaults to auto, as Anthropic does


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
        ),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    chat = messages_to_chat(_body(tools=[WEATHER_TOOL], tool_choice=choice))
    assert chat["tool_choice"] == expected
    assert "parallel_tool_calls" not in chat


def test_disable_parallel_tool_use() -> None:
    choice = {"type": "any", "disable_parallel_tool_use": True}
    chat = messages_to_chat(_body(tools=[WEATHER_TOOL], tool_choice=choice))
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("required", False)


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "none"}])
def test_tool_choice_without_tools_is_dropped_when_meaningless(choice: dict[str, Any]) -> None:
    chat = messages_to_chat(_body(tools=[], tool_choice=choice))
    assert "tools" not in chat and "tool_choice" not in chat


def test_output_format_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    config = {"format": {"type": "json_schema", "schema": schema}, "effort": "high"}
    chat = messages_to_chat(_body(output_config=config))
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


def test_harmless_and_null_fields_are_accepted() -> None:
    body = _body(
        service_tier="auto",
        cache_control={"type": "ephemeral"},
        speed="standard",
        inference_geo="us",
        diagnostics={"previous_message_id": "msg_1"},
        user_profile_id="p",
        workspace_id="w",
        container="cntr_1",
        mcp_servers=None,
    )
    assert messages_to_chat(body) == messages_to_chat(_body())


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        {"type": "computer_20250124", "name": "computer", "display_width_px": 1},
    ],
)
def test_tools_the_model_cannot_be_given_are_refused_when_asked(tool: dict[str, Any]) -> None:
    # serve --hosted-tools refuse; by default they are left out (see test_policy.py)
    with pytest.raises(TranslationError) as caught:
        messages_to_chat(_body(tools=[WEATHER_TOOL, tool]), hosted_tools="refuse")
    assert caught.value.param == "tools.1.type"
    assert tool["type"] in caught.value.message


def test_mcp_servers_are_refused_when_asked() -> None:
    servers = [{"type": "url", "url": "http://x", "name": "m"}]
    with pytest.raises(TranslationError) as caught:
        messages_to_chat(_body(mcp_servers=servers), hosted_tools="refuse")
    assert caught.value.param == "mcp_servers"


def test_input_is_not_mutated() -> None:
    body = _body(
        _user("q"),
        _assistant([{"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "X"}}]),
        _user([{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]),
        system=[{"type": "text", "text": "s"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "auto"},
    )
    before = copy.deepcopy(body)
    messages_to_chat(body)
    count_tokens_chat_body(body)
    assert body == before


# --- messages_to_chat: refusals -----------------------------------------------------------


def _without(key: str) -> dict[str, Any]:
    body = _body()
    del body[key]
    return body


REFUSALS = [
    # (request body, param named by the error, text in the message)
    (_without("model"), "model", "model"),
    (_body(model=7), "model", "model"),
    (_without("max_tokens"), "max_tokens", "field required"),
    (_body(max_tokens="64"), "max_tokens", "integer"),
    (_body(max_tokens=True), "max_tokens", "integer"),
    (_body(max_tokens=0), "max_tokens", ">= 1"),
    (_without("messages"), "messages", "non-empty"),
    (_body(messages=[]), "messages", "non-empty"),
    (_body(messages="hi"), "messages", "non-empty"),
    (_body("hi"), "messages.0", "object"),  # type: ignore[arg-type]
    (_body({"role": "tool", "content": "x"}), "messages.0.role", "'tool'"),
    (_body(_user(5)), "messages.0.content", "string or a list"),
    (_body(_user([{"text": "no type"}])), "messages.0.content.0", "type"),
    (_body(_user([{"type": "text", "text": 3}])), "messages.0.content.0.text", "string"),
    (
        _body(_user([{"type": "image", "source": {"type": "url", "url": "http://x"}}])),
        "messages.0.content.0.type",
        "'image'",
    ),
    (
        _body(_user([{"type": "text", "text": "a"}, {"type": "document", "source": {}}])),
        "messages.0.content.1.type",
        "'document'",
    ),
    (
        _body(_user([{"type": "search_result", "source": "s", "title": "t", "content": []}])),
        "messages.0.content.0.type",
        "'search_result'",
    ),
    (
        _body(_user([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}])),
        "messages.0.content.0.content.0.type",
        "'image'",
    ),
    (
        _body(_user([{"type": "tool_result", "content": "x"}])),
        "messages.0.content.0.tool_use_id",
        "",
    ),
    (
        _body(_user([{"type": "tool_use", "id": "t", "name": "n", "input": {}}])),
        "messages.0.content.0.type",
        "'tool_use'",
    ),
    (
        _body(_user("q"), _assistant([{"type": "tool_result", "tool_use_id": "t"}])),
        "messages.1.content.0.type",
        "'tool_result'",
    ),
    (
        _body(_user("q"), _assistant([{"type": "redacted_thinking", "data": "x"}])),
        "messages.1.content.0.type",
        "'redacted_thinking'",
    ),
    (
        _body(
            _user("q"), _assistant([{"type": "server_tool_use", "id": "s", "name": "web_search"}])
        ),
        "messages.1.content.0.type",
        "'server_tool_use'",
    ),
    (
        _body(
            _user("q"), _assistant([{"type": "tool_use", "id": "t", "name": "n", "input": "{}"}])
        ),
        "messages.1.content.0.input",
        "object",
    ),
    (
        _body(_user("q"), _assistant([{"type": "tool_use", "name": "n", "input": {}}])),
        "messages.1.content.0.id",
        "required",
    ),
    (
        _body(_user([{"type": "text", "text": "x", "citations": [{"type": "char_location"}]}])),
        "messages.0.content.0.citations",
        "citations",
    ),
    (_body(system=[{"type": "image"}]), "system.0.type", "'image'"),
    (_body(system=3), "system", "string or a list"),
    (_body(tools=[{"name": "t"}]), "tools.0.input_schema", "required"),
    (_body(tools=[{"input_schema": {"type": "object"}}]), "tools.0.name", "required"),
    (_body(tools={"name": "t"}), "tools", "list"),
    (_body(tool_choice={"type": "any"}), "tool_choice", "needs tools"),
    (_body(tools=[WEATHER_TOOL], tool_choice={"type": "tool"}), "tool_choice.name", "required"),
    (_body(tools=[WEATHER_TOOL], tool_choice={"type": "best"}), "tool_choice.type", "'best'"),
    (_body(tools=[WEATHER_TOOL], tool_choice="auto"), "tool_choice", "object"),
    (
        _body(tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "web"}),
        "tool_choice.name",
        "not a tool",
    ),
    (_body(thinking="on"), "thinking", "object"),
    (
        _body(context_management={"edits": [{"type": "clear_thinking_20251015", "keep": 2}]}),
        "context_management.edits.0.keep",
        "thinking_turns",
    ),
    (
        _body(
            context_management={
                "edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "x", "value": 1}}]
            }
        ),
        "context_management.edits.0.keep",
        "tool_uses",
    ),
    (_body(output_config={"format": {"type": "text"}}), "output_config.format", "json_schema"),
    (_body(stop_sequences="###"), "stop_sequences", "list"),
    (_body(stop_sequences=["ok", 1]), "stop_sequences", "list"),
    (_body(temperature="hot"), "temperature", "number"),
    (_body(top_k=1.5), "top_k", "integer"),
    (_body(stream="yes"), "stream", "boolean"),
    (_body(metadata={"user_id": 5}), "metadata.user_id", "string"),
]


@pytest.mark.parametrize(("body", "param", "text"), REFUSALS)
def test_refusals_name_the_field(body: dict[str, Any], param: str, text: str) -> None:
    with pytest.raises(TranslationError) as caught:
        messages_to_chat(body)
    assert caught.value.param == param
    assert param in caught.value.message
    assert text in caught.value.message


def test_body_must_be_an_object() -> None:
    with pytest.raises(TranslationError, match="JSON object"):
        messages_to_chat([])  # type: ignore[arg-type]


# --- count_tokens_chat_body ---------------------------------------------------------------


def test_count_tokens_body_keeps_what_shapes_the_prompt() -> None:
    body = _body(system="s", tools=[WEATHER_TOOL], tool_choice={"type": "auto"}, temperature=1)
    del body["max_tokens"]  # count_tokens requests have none
    assert count_tokens_chat_body(body) == {
        "model": "claude-x",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        "tools": [WEATHER_FUNCTION],
    }


def test_count_tokens_body_of_a_prefill() -> None:
    body = count_tokens_chat_body(_body(_user("q"), _assistant("A: ")))
    assert (body["add_generation_prompt"], body["continue_final_message"]) == (False, True)


def test_count_tokens_validates_like_messages() -> None:
    with pytest.raises(TranslationError, match=r"tools\.0\.type"):
        count_tokens_chat_body(
            _body(tools=[{"type": "web_search_20250305", "name": "w"}]), hosted_tools="refuse"
        )
    with pytest.raises(TranslationError, match="max_tokens"):
        count_tokens_chat_body(_body(max_tokens=-1))


def test_error_body_shape() -> None:
    assert error_body("bad") == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert error_body("down", "api_error")["error"]["type"] == "api_error"


# --- chat_to_message ----------------------------------------------------------------------


def _completion(
    message: dict[str, Any], finish: str = "stop", stop_reason: Any = None, **top: Any
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, **message},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "token_ids": [7, 8, 9],
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        "prompt_token_ids": list(range(12)),
        **top,
    }


def _sdk_message(data: dict[str, Any]) -> Message:
    return Message.model_validate(data)


def test_text_completion() -> None:
    message = chat_to_message(_completion({"content": "Hello!"}), model="claude-x")
    assert message == {
        "id": "msg_abc123",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hello!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3},
    }
    _sdk_message(message)


def test_tool_call_completion() -> None:
    calls = [
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Zürich"}'},
        },
        {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "now", "arguments": ""}},
    ]
    completion = _completion({"content": "Let me check.", "tool_calls": calls}, finish="tool_calls")
    message = chat_to_message(completion, model="claude-x")
    assert message["content"] == [
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "chatcmpl-tool-1",
            "name": "weather",
            "input": {"city": "Zürich"},
        },
        {"type": "tool_use", "id": "chatcmpl-tool-2", "name": "now", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert _sdk_message(message).content[1].input == {"city": "Zürich"}  # type: ignore[union-attr]


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1, 2]", '"x"', None, {"city": "Rome"}])
def test_tool_arguments_that_are_not_an_object(arguments: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": arguments}}
    message = chat_to_message(_completion({"tool_calls": [call]}), model="m")
    expected = arguments if isinstance(arguments, dict) else {}
    assert message["content"] == [
        {"type": "tool_use", "id": "c1", "name": "weather", "input": expected}
    ]
    _sdk_message(message)


@pytest.mark.parametrize(
    ("finish", "matched", "tool_calls", "expected"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("stop", 151645, False, ("end_turn", None)),  # an int is a stop token id
        ("stop", "###", False, ("stop_sequence", "###")),
        ("length", None, False, ("max_tokens", None)),
        ("length", None, True, ("max_tokens", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),  # a named tool_choice finishes with "stop"
        ("tool_calls", None, False, ("end_turn", None)),  # no calls to use
        ("abort", None, False, ("end_turn", None)),
    ],
)
def test_stop_reason_mapping(
    finish: str, matched: Any, tool_calls: bool, expected: tuple[str, str | None]
) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "n", "arguments": "{}"}}
    completion = _completion(
        {"content": "x", "tool_calls": [call] if tool_calls else []}, finish, matched
    )
    message = chat_to_message(completion, model="m")
    assert (message["stop_reason"], message["stop_sequence"]) == expected
    _sdk_message(message)


@pytest.mark.parametrize("key", ["reasoning", "reasoning_content"])
def test_reasoning_becomes_a_leading_thinking_block(key: str) -> None:
    message = chat_to_message(_completion({key: "hmm", "content": "4"}), model="m")
    assert message["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "4"},
    ]
    _sdk_message(message)


def test_empty_completion_has_one_empty_text_block() -> None:
    message = chat_to_message(_completion({"content": ""}, usage=None), model="m")
    assert message["content"] == [{"type": "text", "text": ""}]
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 0}
    _sdk_message(message)


def test_message_id_without_a_chat_id() -> None:
    message = chat_to_message(_completion({"content": "x"}, id=None), model="m")
    assert message["id"].startswith("msg_") and len(message["id"]) > 10


def test_completion_without_choices_is_an_upstream_error() -> None:
    with pytest.raises(ValueError, match="no choices"):
        chat_to_message({"id": "chatcmpl-1", "choices": []}, model="m")


# --- MessagesStream -----------------------------------------------------------------------


def _chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    stop_reason: Any = None,
    index: int = 0,
    **top: Any,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "delta": delta or {},
        "logprobs": {"content": [{"token": "t", "logprob": -0.1}]},
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": [5],
    }
    head = {"id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 1}
    return {**head, "model": "upstream-model", "choices": [choice], **top}


def _usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return {"id": "chatcmpl-abc123", "choices": [], "usage": usage}


def _first(**delta: Any) -> dict[str, Any]:
    """vLLM's first chunk: the role, and the prompt's token ids when asked for."""
    return _chunk({"role": "assistant", "content": "", **delta}, prompt_token_ids=list(range(12)))


def _call(index: int, call_id: str | None = None, name: str | None = None, args: str = "") -> Any:
    function: dict[str, Any] = {"arguments": args}
    if name is not None:
        function["name"] = name
    call: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        call.update(id=call_id, type="function")
    return {"tool_calls": [call]}


def _run(chunks: Iterable[dict[str, Any]], model: str = "claude-x") -> list[Event]:
    stream = MessagesStream(model=model)
    events = [event for chunk in chunks for event in stream.feed(chunk)]
    return events + stream.finish()


def _check_grammar(events: list[Event]) -> None:
    """Anthropic's event order: start, ping, consecutive blocks each opened, fed and closed
    in turn, then one message_delta and message_stop. Every data names its event."""
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    opened, open_index = 0, None
    for name, data in events[2:-2]:
        assert data["type"] == name
        if name == "content_block_start":
            assert open_index is None and data["index"] == opened
            open_index, opened = opened, opened + 1
        else:
            assert name in ("content_block_delta", "content_block_stop")
            assert data["index"] == open_index
            if name == "content_block_stop":
                open_index = None
    assert open_index is None


def _sse(events: list[Event]) -> bytes:
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


def _sdk_final(events: list[Event]) -> Message:
    """The final message the SDK's accumulator builds from our events sent as SSE text."""
    _check_grammar(events)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for sse in SSEDecoder().iter_bytes(iter([_sse(events)])):
        if sse.event == "ping":
            continue
        data = sse.json()
        assert data["type"] == sse.event
        event = EVENT.validate_python(data)  # strict: a missing or ill-typed field fails here
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.to_dict())


def _same(streamed: Message, whole: dict[str, Any]) -> None:
    # exclude_none: the accumulator sets fields like stop_details to None explicitly
    expected = Message.model_validate(whole).model_dump(exclude_none=True)
    assert streamed.model_dump(exclude_none=True) == expected


def test_text_stream_events() -> None:
    chunks = [
        _first(),
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo"}),
        _chunk({"content": ""}, finish="stop"),
        _usage_chunk(12, 3),
    ]
    events = _run(chunks)
    assert events == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_abc123",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-x",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 0},
                },
            },
        ),
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "lo"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3, "input_tokens": 12},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    _same(_sdk_final(events), chat_to_message(_completion({"content": "Hello"}), model="claude-x"))


def test_tool_call_stream_matches_the_whole_completion() -> None:
    chunks = [
        _first(),
        _chunk({"content": "Let me check."}),
        _chunk(_call(0, "chatcmpl-tool-1", "weather")),
        _chunk(_call(0, args='{"city": ')),
        _chunk(_call(0, args='"Zürich"}')),
        _chunk(_call(1, "chatcmpl-tool-2", "now", args="{}")),
        _chunk({}, finish="tool_calls"),
        _usage_chunk(12, 20),
    ]
    events = _run(chunks)
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["content_block"] for s in starts] == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "weather", "input": {}},
        {"type": "tool_use", "id": "chatcmpl-tool-2", "name": "now", "input": {}},
    ]
    json_deltas = [
        d["delta"] for n, d in events if d.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert [d["partial_json"] for d in json_deltas] == ['{"city": ', '"Zürich"}', "{}"]
    calls = [
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Zürich"}'},
        },
        {
            "id": "chatcmpl-tool-2",
            "type": "function",
            "function": {"name": "now", "arguments": "{}"},
        },
    ]
    whole = _completion({"content": "Let me check.", "tool_calls": calls}, finish="tool_calls")
    whole["usage"]["completion_tokens"] = 20
    _same(_sdk_final(events), chat_to_message(whole, model="claude-x"))


def test_thinking_stream_matches_the_whole_completion() -> None:
    chunks = [
        _first(),
        _chunk({"reasoning": "2+2"}),
        _chunk({"reasoning": " is 4", "reasoning_content": " is 4"}),  # one name is read
        _chunk({"content": "4"}, finish="stop"),
        _usage_chunk(12, 3),
    ]
    events = _run(chunks)
    final = _sdk_final(events)
    whole = _completion({"reasoning": "2+2 is 4", "content": "4"})
    _same(final, chat_to_message(whole, model="claude-x"))
    assert [block.type for block in final.content] == ["thinking", "text"]


def test_stop_sequence_stream() -> None:
    chunks = [
        _first(),
        _chunk({"content": "a"}, finish="stop", stop_reason="###"),
        _usage_chunk(1, 1),
    ]
    final = _sdk_final(_run(chunks))
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "###")


def test_max_tokens_mid_tool_call() -> None:
    chunks = [
        _first(),
        _chunk(_call(0, "c1", "weather", args='{"city": "Par')),
        _chunk({}, finish="length"),
        _usage_chunk(12, 64),
    ]
    final = _sdk_final(_run(chunks))
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 64


def test_text_after_a_tool_call_opens_a_new_block() -> None:
    chunks = [_first(), _chunk(_call(0, "c1", "now", args="{}")), _chunk({"content": "done"})]
    events = _run(chunks)
    final = _sdk_final(events)
    assert [block.type for block in final.content] == ["tool_use", "text"]
    assert final.stop_reason == "tool_use"


def test_whole_tool_call_in_one_chunk_and_two_calls_in_one_delta() -> None:
    two = {
        "tool_calls": [
            _call(0, "c1", "a", "{}")["tool_calls"][0],
            _call(1, "c2", "b", "{}")["tool_calls"][0],
        ]
    }
    final = _sdk_final(_run([_first(), _chunk(two, finish="tool_calls")]))
    assert [(b.type, b.id) for b in final.content] == [("tool_use", "c1"), ("tool_use", "c2")]  # type: ignore[union-attr]


def test_a_closed_tool_call_cannot_continue() -> None:
    stream = MessagesStream(model="m")
    stream.feed(_first())
    stream.feed(_chunk(_call(0, "c1", "a", "{")))
    stream.feed(_chunk(_call(1, "c2", "b", "{}")))
    with pytest.raises(RuntimeError, match="tool call 0"):
        stream.feed(_chunk(_call(0, args="}")))


def test_other_choices_are_ignored() -> None:
    chunks = [_first(), _chunk({"content": "mine"}), _chunk({"content": "theirs"}, index=1)]
    final = _sdk_final(_run(chunks))
    assert [block.text for block in final.content] == ["mine"]  # type: ignore[union-attr]


def test_finish_without_finish_reason_or_usage() -> None:
    final = _sdk_final(_run([_chunk({"role": "assistant", "content": "cut"})]))
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (0, 0)
    assert [block.text for block in final.content] == ["cut"]  # type: ignore[union-attr]


def test_finish_of_an_empty_stream() -> None:
    events = MessagesStream(model="m").finish()
    final = _sdk_final(events)
    assert final.content[0].type == "text" and final.content[0].text == ""
    assert final.model == "m" and final.id.startswith("msg_")


def test_usage_corrects_input_tokens_when_ids_were_missing() -> None:
    chunks = [_chunk({"role": "assistant", "content": "x"}, finish="stop"), _usage_chunk(30, 2)]
    events = _run(chunks)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0
    final = _sdk_final(events)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (30, 2)


def test_finish_twice_and_feed_after_finish() -> None:
    stream = MessagesStream(model="m")
    stream.feed(_first())
    assert stream.finish()
    assert stream.finish() == []
    with pytest.raises(RuntimeError):
        stream.feed(_chunk({"content": "late"}))


def test_error_event() -> None:
    stream = MessagesStream(model="m")
    stream.feed(_first())
    stream.feed(_chunk({"content": "par"}))
    assert stream.error("upstream went away") == [
        (
            "error",
            {"type": "error", "error": {"type": "api_error", "message": "upstream went away"}},
        )
    ]
    assert stream.finish() == []


# --- through a real SDK client (in-process transport, no network) ------------------------


def _client(body: bytes, content_type: str) -> anthropic.Anthropic:
    def answer(request: Any) -> Any:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    transport = httpx2.MockTransport(answer)
    return anthropic.Anthropic(
        api_key="test",
        base_url="http://proxy.test",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )


REQUEST = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def test_sdk_client_streams_our_events() -> None:
    chunks = [
        _first(),
        _chunk({"content": "Checking."}),
        _chunk(_call(0, "c1", "weather", '{"city": "Oslo"}')),
        _chunk({}, finish="tool_calls"),
        _usage_chunk(12, 9),
    ]
    with (
        _client(_sse(_run(chunks)), "text/event-stream") as client,
        client.messages.stream(**REQUEST) as stream,  # type: ignore[arg-type]
    ):
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["Checking."]
    assert final.stop_reason == "tool_use"
    assert final.content[1].input == {"city": "Oslo"}  # type: ignore[union-attr]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 9)


def test_sdk_client_raises_on_our_error_event() -> None:
    stream = MessagesStream(model="claude-x")
    events = stream.feed(_first()) + stream.error("upstream went away")
    with (
        _client(_sse(events), "text/event-stream") as client,
        pytest.raises(anthropic.APIStatusError, match="upstream went away"),
        client.messages.stream(**REQUEST) as sdk_stream,  # type: ignore[arg-type]
    ):
        sdk_stream.get_final_message()


def test_sdk_client_reads_our_message() -> None:
    message = chat_to_message(_completion({"content": "Hello!"}), model="claude-x")
    with _client(json.dumps(message).encode(), "application/json") as client:
        answer = client.messages.create(**REQUEST)  # type: ignore[arg-type]
    assert answer.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert answer.stop_reason == "end_turn"
