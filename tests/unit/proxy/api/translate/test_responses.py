"""proxy.api.translate.responses: the Responses API to and from chat completions."""

from __future__ import annotations

from typing import Any

import pytest
from openai import omit
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.api.translate.responses import (
    ResponsesStream,
    TranslationError,
    chat_to_response,
    conversation_after,
    new_response_id,
    responses_to_chat,
)
from proxy.base.capture import ClientAsked
from proxy.generation.streaming import response_to_chunks

RESPONSE_ID = "resp_abc"
EVENTS = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather in a city",
        "parameters": WEATHER["parameters"],
        "strict": True,
    },
}
CALL = {
    "id": "chatcmpl-tool-1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
}
USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def _chat(message: dict[str, Any], finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "served",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, **message},
                "finish_reason": finish,
                **choice,
            }
        ],
        "usage": USAGE,
    }


def _chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "served",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}],
    }


USAGE_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": USAGE}


def _stream(request: dict[str, Any], chunks: list[dict[str, Any]]) -> tuple[Any, list[Any]]:
    stream = ResponsesStream(request=request, response_id=RESPONSE_ID, created_at=7)
    events = [event for chunk in chunks for event in stream.feed(chunk)]
    return stream, events + stream.finish()


def _replay(events: list[dict[str, Any]]) -> list[Any]:
    """Every event through the SDK's own parser and stream accumulator."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    return [out for event in events for out in state.handle_event(EVENTS.validate_python(event))]


# ---------------------------------------------------------------- request


def test_string_input_is_one_user_message() -> None:
    chat = responses_to_chat({"model": "m", "input": "hi"})
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_instructions_lead_then_history_then_input() -> None:
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    chat = responses_to_chat({"instructions": "be brief", "input": "c"}, history=history)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        *history,
        {"role": "user", "content": "c"},
    ]


def test_history_alone_is_enough_input() -> None:
    history = [{"role": "user", "content": "a"}]
    assert responses_to_chat({"input": []}, history=history)["messages"] == history


def test_message_items_of_every_role_and_shape() -> None:
    body = {
        "input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "s"}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "x"},
                    {"type": "input_text", "text": "y"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            },
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        ]
    }
    assert responses_to_chat(body)["messages"] == [
        {"role": "system", "content": "rules"},  # open chat templates know no developer role
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "assistant", "content": "no"},
    ]


def test_consecutive_function_calls_fold_into_one_assistant_message() -> None:
    body = {
        "input": [
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "noon"}],
            },
        ]
    }
    assert responses_to_chat(body)["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "{}"},
                },
                {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ]


def test_reasoning_text_and_call_fold_into_one_assistant_message() -> None:
    body = {
        "input": [
            {"role": "user", "content": "q"},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "think"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "t"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "s"}]},
        ]
    }
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert responses_to_chat(body)["messages"][1:] == [
        {"role": "assistant", "content": "t", "reasoning": "think", "tool_calls": [call]},
        {"role": "assistant", "content": None, "reasoning": "s"},
    ]


def test_encrypted_only_reasoning_is_refused() -> None:
    item = {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"}
    with pytest.raises(TranslationError) as caught:
        responses_to_chat({"input": [item]})
    assert caught.value.param == "input[0]"


def test_function_tools_and_sampling_fields() -> None:
    body = {
        "model": "m",
        "input": "hi",
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_output_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "parallel_tool_calls": False,
        "safety_identifier": "u1",
        "reasoning": {"effort": "low", "summary": "auto"},
        "stream": True,
        "top_k": 20,
        # ours or ignored: never sent upstream
        "store": False,
        "previous_response_id": "resp_x",
        "metadata": {"k": "v"},
        "prompt_cache_key": "p",
        "text": {"format": {"type": "text"}, "verbosity": "low"},
    }
    assert responses_to_chat(body) == {
        "model": "m",
        "temperature": 0.5,
        "top_p": 0.9,
        "parallel_tool_calls": False,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [CHAT_WEATHER],
        "tool_choice": "required",
        "max_tokens": 64,
        "user": "u1",
        "reasoning_effort": "low",
        "stream": True,
        "top_k": 20,
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "weather"},
            {"type": "function", "function": {"name": "weather"}},
        ),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    chat = responses_to_chat({"input": "hi", "tools": [WEATHER], "tool_choice": choice})
    assert chat["tool_choice"] == expected


def test_allowed_tools_narrow_the_list() -> None:
    other = {"type": "function", "name": "time"}
    choice = {"type": "allowed_tools", "mode": "required", "tools": [other]}
    chat = responses_to_chat({"input": "hi", "tools": [WEATHER, other], "tool_choice": choice})
    assert chat["tools"] == [{"type": "function", "function": {"name": "time"}}]
    assert chat["tool_choice"] == "required"


@pytest.mark.parametrize(
    "choice",
    [{"type": "function", "name": "nope"}, {"type": "web_search_preview"}, {"type": "mcp"}, "any"],
)
def test_unusable_tool_choice_is_refused(choice: Any) -> None:
    with pytest.raises(TranslationError) as caught:
        responses_to_chat({"input": "hi", "tools": [WEATHER], "tool_choice": choice})
    assert caught.value.param == "tool_choice"


@pytest.mark.parametrize(
    "kind",
    [
        "web_search",
        "web_search_preview",
        "file_search",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "custom",
    ],
)
def test_tools_the_model_cannot_be_given_are_refused_by_name_when_asked(kind: str) -> None:
    # serve --hosted-tools refuse; by default they are left out (see test_policy.py)
    with pytest.raises(TranslationError) as caught:
        responses_to_chat(
            {"input": "hi", "tools": [WEATHER, {"type": kind}]}, hosted_tools="refuse"
        )
    assert kind in caught.value.message
    assert caught.value.param == "tools[1]"


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True},
            {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
            },
        ),
    ],
)
def test_text_format(fmt: dict[str, Any], expected: Any) -> None:
    chat = responses_to_chat({"input": "hi", "text": {"format": fmt}})
    assert chat.get("response_format") == expected


def test_logprobs_include_asks_upstream() -> None:
    body = {
        "input": "hi",
        "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
        "top_logprobs": 3,
    }
    chat = responses_to_chat(body)
    assert chat["logprobs"] is True
    assert chat["top_logprobs"] == 3


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0]"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": "hi", "background": True}, "background"),
        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": "hi", "include": "reasoning.encrypted_content"}, "include"),
        ({"input": "hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "hi", "instructions": [{"role": "system", "content": "x"}]}, "instructions"),
        ({"input": []}, "input"),
        ({"model": "m"}, "input"),
    ],
)
def test_unsupported_requests_are_refused_naming_the_param(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(TranslationError) as caught:
        responses_to_chat(body)
    assert caught.value.param == param


def test_false_background_is_fine() -> None:
    assert responses_to_chat({"input": "hi", "background": False})["messages"]


# ---------------------------------------------------------------- response


def test_text_answer_becomes_a_valid_response() -> None:
    request = {"model": "m", "input": "hi", "metadata": {"k": "v"}}
    response = chat_to_response(
        _chat({"content": "Hello"}), request=request, response_id=RESPONSE_ID, created_at=7
    )
    assert response["output"] == [
        {
            "id": "msg_abc_0",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}
            ],
        }
    ]
    assert response["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    }
    parsed = Response.model_validate(response)
    assert (parsed.id, parsed.status, parsed.model, parsed.created_at) == (
        RESPONSE_ID,
        "completed",
        "served",
        7,
    )
    assert parsed.output_text == "Hello"
    assert parsed.metadata == {"k": "v"}


def test_reasoning_text_and_calls_in_order() -> None:
    message = {"reasoning": "hmm", "content": "Let me look.", "tool_calls": [CALL]}
    response = chat_to_response(
        _chat(message, "tool_calls"), request={"input": "x"}, response_id=RESPONSE_ID, created_at=7
    )
    reasoning, text, call = response["output"]
    assert reasoning == {
        "id": "rs_abc_0",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "hmm"}],
        "status": "completed",
    }
    assert text["id"] == "msg_abc_1"
    assert call == {
        "id": "fc_abc_2",
        "type": "function_call",
        "status": "completed",
        "arguments": '{"city": "Paris"}',
        "call_id": "chatcmpl-tool-1",
        "name": "weather",
    }
    assert Response.model_validate(response).output_text == "Let me look."


def test_reasoning_content_key_is_read_too() -> None:
    response = chat_to_response(
        _chat({"reasoning_content": "r", "content": "a"}),
        request={},
        response_id="resp_1",
        created_at=0,
    )
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]


def test_length_makes_an_incomplete_response() -> None:
    response = chat_to_response(
        _chat({"content": "Hel"}, "length"),
        request={"max_output_tokens": 3},
        response_id="resp_1",
        created_at=0,
    )
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert Response.model_validate(response).max_output_tokens == 3


def test_request_settings_are_echoed() -> None:
    request = {
        "model": "m",
        "instructions": "be brief",
        "input": "hi",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "weather"},
        "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
        "temperature": 0.2,
        "top_p": 0.8,
        "parallel_tool_calls": False,
        "previous_response_id": "resp_prev",
        "store": False,
        "reasoning": {"effort": "low"},
        "user": "u",
    }
    response = chat_to_response(
        _chat({"content": "{}"}), request=request, response_id=RESPONSE_ID, created_at=7
    )
    parsed = Response.model_validate(response)
    assert parsed.instructions == "be brief"
    assert parsed.tools[0].name == "weather"
    assert parsed.tool_choice.type == "function"
    assert parsed.text.format.type == "json_schema"
    assert (parsed.temperature, parsed.top_p, parsed.parallel_tool_calls) == (0.2, 0.8, False)
    assert (parsed.previous_response_id, parsed.store, parsed.truncation) == (
        "resp_prev",
        False,
        "disabled",
    )


def test_defaults_when_the_request_says_little() -> None:
    parsed = Response.model_validate(
        chat_to_response(_chat({"content": "a"}), request={}, response_id="resp_1", created_at=0)
    )
    assert (parsed.tool_choice, parsed.tools, parsed.parallel_tool_calls, parsed.store) == (
        "auto",
        [],
        True,
        True,
    )
    assert parsed.text.format.type == "text"


def _entry(token: str, logprob: float = -0.5) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": None,
        "top_logprobs": [{"token": token, "logprob": logprob}],
    }


def test_logprobs_only_when_included() -> None:
    chat = _chat({"content": "Hi!"}, logprobs={"content": [_entry("Hi"), _entry("!")]})
    plain = chat_to_response(chat, request={}, response_id="resp_1", created_at=0)
    assert plain["output"][0]["content"][0]["logprobs"] == []
    asked = chat_to_response(
        chat,
        request={"include": ["message.output_text.logprobs"]},
        response_id="resp_1",
        created_at=0,
    )
    logprobs = asked["output"][0]["content"][0]["logprobs"]
    assert logprobs[0] == {
        "token": "Hi",
        "bytes": [72, 105],
        "logprob": -0.5,
        "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.5}],
    }
    assert len(logprobs) == 2
    Response.model_validate(asked)


def test_logprobs_skip_reasoning_tokens() -> None:
    tokens = ["The", " answer", " is", " 4", "</think>", "\n\n", "4"]
    chat = _chat(
        {"reasoning": "The answer is 4", "content": "4"},
        logprobs={"content": [_entry(t) for t in tokens]},
    )
    response = chat_to_response(
        chat,
        request={"include": ["message.output_text.logprobs"]},
        response_id="resp_1",
        created_at=0,
    )
    assert [entry["token"] for entry in response["output"][1]["content"][0]["logprobs"]] == ["4"]


# ---------------------------------------------------------------- conversation


def test_conversation_after_drops_instructions_and_appends_the_answer() -> None:
    request = {
        "instructions": "be brief",
        "input": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
    }
    chat_request = responses_to_chat(request)
    message = {"reasoning": "hmm", "content": "Let me look.", "tool_calls": [CALL]}
    response = chat_to_response(
        _chat(message), request=request, response_id=RESPONSE_ID, created_at=7
    )
    assert conversation_after(chat_request, response) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me look.", "reasoning": "hmm", "tool_calls": [CALL]},
    ]


def test_stored_and_resent_conversations_give_the_same_prompt() -> None:
    first = {"instructions": "be brief", "input": "weather in Paris?", "tools": [WEATHER]}
    chat_request = responses_to_chat(first)
    response = chat_to_response(
        _chat({"content": None, "tool_calls": [CALL]}, "tool_calls"),
        request=first,
        response_id=RESPONSE_ID,
        created_at=7,
    )
    result = {"type": "function_call_output", "call_id": CALL["id"], "output": "sunny"}
    chained = responses_to_chat(
        {"instructions": "be brief", "input": [result], "tools": [WEATHER]},
        history=conversation_after(chat_request, response),
    )
    resent = responses_to_chat(
        {
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "weather in Paris?"},
                *response["output"],
                result,
            ],
            "tools": [WEATHER],
        }
    )
    assert chained == resent
    assert chained["messages"][2]["tool_calls"] == [CALL]


# ---------------------------------------------------------------- streaming


def test_text_stream_event_sequence() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo"}),
        _chunk({}, "stop"),
        USAGE_CHUNK,
    ]
    stream, events = _stream({"model": "m", "input": "hi"}, chunks)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert {event["item_id"] for event in events if "item_id" in event} == {"msg_abc_0"}
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert events[2]["item"]["content"] == []
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello"
    assert final.usage.total_tokens == 17
    assert stream.response is events[-1]["response"]


def test_stream_matches_the_whole_answer() -> None:
    request = {"model": "m", "input": "hi", "tools": [WEATHER]}
    chat = _chat(
        {"reasoning": "hmm", "content": "Let me look.", "tool_calls": [CALL]}, "tool_calls"
    )
    asked = ClientAsked(token_ids=False, logprobs=False, stream_usage=True)
    stream, _ = _stream(request, response_to_chunks(chat, asked))
    assert stream.response == chat_to_response(
        chat, request=request, response_id=RESPONSE_ID, created_at=7
    )


def test_sdk_accumulates_reasoning_text_and_parallel_calls() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"reasoning": "Need "}),
        _chunk({"reasoning": "weather."}),
        _chunk({"content": "Checking."}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "weather", "arguments": ""},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city"'},
                    }
                ]
            }
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': "Rome"}'}}]}),
        _chunk({}, "tool_calls"),
        USAGE_CHUNK,
    ]
    stream, events = _stream({"model": "m", "input": "hi", "tools": [WEATHER]}, chunks)
    seen = _replay(events)
    types = [event.type for event in seen]
    assert (
        types.count("response.output_item.added") == types.count("response.output_item.done") == 4
    )
    assert "response.reasoning_text.delta" in types
    assert [event.snapshot for event in seen if event.type == "response.output_text.delta"] == [
        "Checking."
    ]
    arguments = {
        event.item_id: event.arguments
        for event in seen
        if event.type == "response.function_call_arguments.done"
    }
    assert arguments == {"fc_abc_2": '{"city": "Paris"}', "fc_abc_3": '{"city": "Rome"}'}
    final = seen[-1].response
    assert final.output_text == "Checking."
    assert [(item.type, getattr(item, "call_id", None)) for item in final.output] == [
        ("reasoning", None),
        ("message", None),
        ("function_call", "c0"),
        ("function_call", "c1"),
    ]
    assert final.output[0].content[0].text == "Need weather."
    assert [item.arguments for item in final.output[2:]] == [
        '{"city": "Paris"}',
        '{"city": "Rome"}',
    ]
    Response.model_validate(stream.response)


def test_every_event_has_a_consistent_position() -> None:
    chunks = [
        _chunk({"reasoning": "r"}),
        _chunk({"content": "a"}),
        _chunk({"reasoning": "r2"}),
        _chunk({"content": "b"}),
        _chunk({}, "stop"),
    ]
    _, events = _stream({"input": "hi"}, chunks)
    _replay(events)
    final = events[-1]["response"]
    ids = [item["id"] for item in final["output"]]
    assert [item["type"] for item in final["output"]] == [
        "reasoning",
        "message",
        "reasoning",
        "message",
    ]
    for event in events:
        if "output_index" in event:
            assert (
                event.get("item_id", event.get("item", {}).get("id")) == ids[event["output_index"]]
            )


def test_length_stream_ends_incomplete() -> None:
    chunks = [_chunk({"content": "Hel"}), _chunk({}, "length"), USAGE_CHUNK]
    _, events = _stream({"input": "hi", "max_output_tokens": 1}, chunks)
    seen = _replay(events)
    assert seen[-1].type == "response.incomplete"
    assert seen[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-2]["item"]["status"] == "incomplete"
    assert Response.model_validate(events[-1]["response"]).output_text == "Hel"


def test_broken_stream_fails_with_what_it_had() -> None:
    stream = ResponsesStream(request={"input": "hi"}, response_id=RESPONSE_ID, created_at=7)
    events = stream.feed(_chunk({"content": "Hel"})) + stream.error("upstream went away")
    assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
    seen = _replay(events)
    failed = seen[-1].response
    assert failed.status == "failed"
    assert failed.error.message == "upstream went away"
    assert failed.output[0].status == "incomplete"
    assert stream.finish() == [] and stream.error("again") == []


def test_stream_that_never_started_still_opens_before_failing() -> None:
    stream = ResponsesStream(request={"input": "hi"}, response_id=RESPONSE_ID, created_at=7)
    events = stream.error("refused")
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    _replay(events)


def test_empty_stream_completes_empty() -> None:
    _, events = _stream({"input": "hi"}, [])
    assert [event.type for event in _replay(events)] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]


def test_stream_logprobs_follow_the_text_when_asked() -> None:
    chunk = _chunk({"content": "Hi"}, logprobs={"content": [_entry("Hi", -0.1)]})
    plain = ResponsesStream(request={}, response_id=RESPONSE_ID, created_at=0)
    assert plain.feed(chunk)[-1]["logprobs"] == []
    request = {"include": ["message.output_text.logprobs"]}
    stream, events = _stream(request, [chunk, _chunk({}, "stop")])
    _replay(events)
    delta = next(event for event in events if event["type"] == "response.output_text.delta")
    assert delta["logprobs"][0]["logprob"] == -0.1
    final = Response.model_validate(stream.response)
    assert final.output[0].content[0].logprobs[0].token == "Hi"


def test_events_do_not_change_after_they_are_emitted() -> None:
    stream = ResponsesStream(request={}, response_id=RESPONSE_ID, created_at=0)
    added = stream.feed(_chunk({"content": "a"}))
    stream.feed(_chunk({"content": "b"}))
    part = next(event for event in added if event["type"] == "response.content_part.added")
    assert part["part"]["text"] == ""


def test_new_response_id() -> None:
    first, second = new_response_id(), new_response_id()
    assert first.startswith("resp_") and len(first) == 37 and first != second
    int(first.removeprefix("resp_"), 16)
