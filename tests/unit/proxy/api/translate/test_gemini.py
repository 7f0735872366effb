"""proxy.api.translate.gemini: the Gemini API <-> chat completions.

Hand-written inputs and expected outputs for each mapping; what we emit is checked to
validate as the google-genai SDK's own `GenerateContentResponse`.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.translate.gemini import (
    GeminiStream,
    chat_to_gemini,
    error_body,
    gemini_to_chat,
    includes_thoughts,
    json_schema,
)
from proxy.api.translate.messages import TranslationError
from proxy.base.compat_policy import Compat


def translate(body: dict[str, Any], **options: Any) -> tuple[dict[str, Any], Compat]:
    compat = Compat()
    return gemini_to_chat(body, model="m", compat=compat, **options), compat


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def test_a_tool_loop_becomes_chat_messages_with_matching_call_ids() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use tools."}]},
        "contents": [
            user("list the files"),
            {"role": "model", "parts": [
                {"text": "Looking.", "thought": True, "thoughtSignature": "c2ln"},
                {"functionCall": {"name": "ls", "args": {"dir": "."}}},
                {"functionCall": {"name": "cat", "args": {"path": "ä.txt"}, "id": "abc"}},
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "cat", "id": "abc", "response": {"out": "x"}}},
                {"functionResponse": {"name": "ls", "response": {"output": "a.txt"}}},
                {"text": "and now?"},
            ]},
        ],
    }  # fmt: skip
    chat, compat = translate(body)
    system, first, model, *rest = chat["messages"]
    assert system == {"role": "system", "content": "Be brief.\nUse tools."}
    assert first == {"role": "user", "content": "list the files"}
    assert model["content"] is None and model["reasoning"] == "Looking."
    ls, cat = model["tool_calls"]
    assert ls["id"] == "call_1_0" and ls["function"] == {"name": "ls", "arguments": '{"dir": "."}'}
    assert cat["id"] == "abc" and cat["function"]["arguments"] == '{"path": "ä.txt"}'
    assert rest == [
        {"role": "tool", "tool_call_id": "abc", "content": '{"out": "x"}'},
        {"role": "tool", "tool_call_id": "call_1_0", "content": '{"output": "a.txt"}'},
        {"role": "user", "content": "and now?"},
    ]
    assert compat.as_record() == {"ignored": ["contents.parts.thoughtSignature"]}
    # the same conversation sent again gets the same ids: its turns stitch
    assert translate(body)[0]["messages"] == chat["messages"]


def test_function_declarations_become_chat_tools_and_hosted_tools_are_left_out() -> None:
    body = {
        "contents": [user("hi")],
        "tools": [
            {"functionDeclarations": [
                {"name": "read", "description": "Read a file",
                 "parametersJsonSchema": {"type": "object",
                                          "properties": {"p": {"type": "string"}}}},
                {"name": "old", "parameters": {"type": "OBJECT", "properties": {
                    "n": {"type": "INTEGER", "nullable": True},
                    "xs": {"type": "ARRAY", "items": {"type": "STRING"}}}}},
            ]},
            {"googleSearch": {}},
            {"code_execution": {}},
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["read"]}},
    }  # fmt: skip
    chat, compat = translate(body)
    assert [t["function"]["name"] for t in chat["tools"]] == ["read"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "read"}}
    assert compat.notes["left_out"] == ["googleSearch", "codeExecution"]
    assert compat.notes["honoured"] == ["toolConfig.functionCallingConfig.allowedFunctionNames"]
    chat, _ = translate({**body, "toolConfig": {"functionCallingConfig": {"mode": "auto"}}})
    assert [t["function"]["name"] for t in chat["tools"]] == ["read", "old"]
    assert chat["tool_choice"] == "auto"
    assert chat["tools"][1]["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"]},
            "xs": {"type": "array", "items": {"type": "string"}},
        },
    }
    with pytest.raises(TranslationError, match="googleSearch"):
        translate(body, hosted_tools="refuse")
    with pytest.raises(TranslationError, match="mode"):
        translate({**body, "toolConfig": {"functionCallingConfig": {"mode": "SOMETIMES"}}})


def test_generation_config_maps_onto_sampling_and_unknown_fields_are_recorded() -> None:
    body = {
        "contents": [user("hi")],
        "generation_config": {  # snake_case is the same field in Google's JSON
            "temperature": 0.2, "topP": 0.9, "top_k": 40, "maxOutputTokens": 64,
            "stopSequences": ["END"], "seed": 7, "presencePenalty": 0.1,
            "responseMimeType": "application/json",
            "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "NUMBER"}}},
            "thinkingConfig": {"thinkingBudget": 0, "includeThoughts": False},
            "responseLogprobs": True, "brandNewKnob": 3,
        },
        "safetySettings": [{"category": "HARM_CATEGORY_X", "threshold": "BLOCK_NONE"}],
        "cachedContent": "cachedContents/1",
        "futureField": {"x": 1},
    }  # fmt: skip
    chat, compat = translate(body)
    sampling = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed")
    assert {k: chat[k] for k in sampling} == {
        "temperature": 0.2, "top_p": 0.9, "top_k": 40, "max_tokens": 64, "stop": ["END"], "seed": 7,
    }  # fmt: skip
    assert chat["presence_penalty"] == 0.1
    assert chat["response_format"]["json_schema"]["schema"] == {
        "type": "object",
        "properties": {"a": {"type": "number"}},
    }
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    assert compat.notes == {
        "ignored": ["safetySettings", "cachedContent", "generationConfig.responseLogprobs"],
        "unknown": ["futureField", "generationConfig.brandNewKnob"],
        "honoured": ["generationConfig.responseMimeType", "generationConfig.thinkingConfig"],
    }
    for bad, where in (
        ({"candidateCount": 2}, "candidateCount"),
        ({"responseModalities": ["IMAGE"]}, "responseModalities"),
        ({"temperature": "hot"}, "temperature"),
        ({"responseMimeType": "text/x.enum"}, "responseMimeType"),
    ):
        with pytest.raises(TranslationError, match=where):
            translate({"contents": [user("hi")], "generationConfig": bad})


def test_vllms_own_extensions_in_generation_config_reach_vllm_under_its_names() -> None:
    regex = {"regex": "<tool_call>.*</tool_call>"}
    for config in (
        {"structured_outputs": regex, "min_p": 0.05, "repetition_penalty": 1.1},
        {"structuredOutputs": regex, "minP": 0.05, "repetitionPenalty": 1.1},
    ):
        chat, compat = translate({"contents": [user("hi")], "generationConfig": config})
        assert chat["structured_outputs"] == regex
        assert (chat["min_p"], chat["repetition_penalty"]) == (0.05, 1.1)
        assert "unknown" not in compat.notes, compat.notes


def test_what_cannot_be_shown_to_the_model_is_refused_by_name() -> None:
    for contents, named in (
        ([], "contents"),
        ([{"role": "user", "parts": [{"fileData": {"fileUri": "gs://b/f"}}]}], "fileData"),
        ([{"role": "user", "parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AA"}}]}],
         "inlineData"),
        ([{"role": "system", "parts": [{"text": "x"}]}], "role"),
        ([{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}],
         "answers no functionCall"),
    ):  # fmt: skip
        with pytest.raises(TranslationError, match=named):
            translate({"contents": contents})
    image = {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}}
    chat, _ = translate({"contents": [{"role": "user", "parts": [{"text": "see"}, image]}]})
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
    ]


def test_a_whole_answer_is_a_generate_content_response() -> None:
    from google.genai import types

    chat = {
        "id": "chatcmpl-42",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Sure.", "reasoning": "hmm",
                        "tool_calls": [{"id": "call_9", "type": "function",
                                        "function": {"name": "ls", "arguments": '{"dir": "."}'}}]},
            "finish_reason": "tool_calls",
        }],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5},
    }  # fmt: skip
    answer = chat_to_gemini(chat, model="m", thoughts=True)
    assert answer["candidates"][0]["content"]["parts"] == [
        {"text": "hmm", "thought": True},
        {"text": "Sure."},
        {"functionCall": {"name": "ls", "args": {"dir": "."}, "id": "call_9"}},
    ]
    assert answer["candidates"][0]["finishReason"] == "STOP"
    assert answer["usageMetadata"] == {
        "promptTokenCount": 11, "candidatesTokenCount": 5, "totalTokenCount": 16,
    }  # fmt: skip
    parsed = types.GenerateContentResponse.model_validate(answer)
    assert parsed.function_calls[0].args == {"dir": "."}
    hidden = chat_to_gemini(chat, model="m", thoughts=False)
    assert {"text": "hmm", "thought": True} not in hidden["candidates"][0]["content"]["parts"]
    cut = {"choices": [{"index": 0, "message": {"content": ""}, "finish_reason": "length"}]}
    cut_answer = chat_to_gemini(cut, model="m", thoughts=False)
    assert cut_answer["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert cut_answer["candidates"][0]["content"]["parts"] == [{"text": ""}]


def test_a_stream_sends_text_as_it_comes_and_a_call_whole_at_the_end() -> None:
    from google.genai import types

    stream = GeminiStream(model="m", thoughts=False)
    chunks = [
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo", "reasoning": "x"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "ls", "arguments": '{"di'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'r": "."}'}}]}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}},
    ]  # fmt: skip
    out = [event for chunk in chunks for event in stream.feed(chunk)] + stream.finish()
    assert [e["candidates"][0]["content"]["parts"] for e in out] == [
        [{"text": "Hel"}],
        [{"text": "lo"}],
        [{"functionCall": {"name": "ls", "args": {"dir": "."}, "id": "call_1"}}],
    ]
    assert "finishReason" not in out[0]["candidates"][0]
    assert out[-1]["candidates"][0]["finishReason"] == "STOP"
    assert out[-1]["usageMetadata"]["totalTokenCount"] == 7
    assert all(e["responseId"] == "1" for e in out)
    for event in out:
        types.GenerateContentResponse.model_validate(event)
    assert stream.finish() == []
    assert GeminiStream(model="m", thoughts=False).error("gone") == [
        {"error": {"code": 500, "message": "gone", "status": "INTERNAL"}}
    ]


def test_small_parts() -> None:
    assert error_body(429, "slow down") == {
        "error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}
    }
    assert includes_thoughts({"generationConfig": {"thinkingConfig": {"includeThoughts": True}}})
    assert not includes_thoughts({"generation_config": {"thinking_config": {}}})
    assert json_schema({"type": "STRING", "enum": ["a"]}) == {"type": "string", "enum": ["a"]}
