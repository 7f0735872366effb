"""Re-rendering a recorded trajectory for the student (learner/supervised/render.py): its own
template and tokenizer, token-exact to `apply_chat_template`, the loss mask on assistant
turns alone; tool calls and results render; what cannot be rendered is a counted drop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer

from learner.chat_templates import SMOLLM2_TOOLS
from learner.supervised.messages import conversation_of, request_tools
from learner.supervised.render import Renderer
from learner.tiny_model import build_tiny_model
from store.trajectory_record import Trajectory, TrajectoryCall

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
# SmolLM2-135M-Instruct's own template: no tools, no tool calls
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)
    return AutoTokenizer.from_pretrained(str(model))


def _with_template(tokenizer: Any, template: str) -> Any:
    copied = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    copied.chat_template = template
    return copied


def _tool_call_trajectory() -> Trajectory:
    """A chat call answered after a tool call and its result (the teacher's second turn)."""
    request = {
        "messages": [
            {"role": "system", "content": "Use the calculator."},
            {"role": "user", "content": "What is 2+3?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ],
        "tools": [CALCULATOR],
    }
    response = {"choices": [{"message": {"role": "assistant", "content": "It is 5."}}]}
    call = TrajectoryCall(id="c", api="chat.completions", request=request, response=response)
    return Trajectory(id="t", calls=(call,))


def _own_rendering(tokenizer: Any) -> list[int]:
    """What the student's own template gives for the same messages."""
    messages = [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "2+3"}},
                }
            ],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
    ]
    out = tokenizer.apply_chat_template(messages, tools=[CALCULATOR], tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _trained(tokenizer: Any, ids: list[int], mask: list[bool]) -> list[str]:
    """The trained runs of tokens, as text."""
    runs, current = [], []
    for token, on in zip(ids, mask, strict=True):
        if on:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_a_tool_call_trajectory_renders_token_exact_with_every_assistant_turn_trained(
    tokenizer: Any,
) -> None:
    sample = Renderer(tokenizer, max_tokens=2048).render(_tool_call_trajectory())
    assert not isinstance(sample, str), sample
    assert sample.token_ids == _own_rendering(tokenizer)
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    # both assistant turns, each up to its end-of-turn token; nothing of the system prompt,
    # the tools, the question, the tool's result or the generation prompts
    assert _trained(tokenizer, sample.token_ids, sample.loss_mask) == [
        call + "<|im_end|>",
        "It is 5.<|im_end|>",
    ]
    assert sample.logprobs == [0.0] * len(sample.token_ids)
    assert sample.call_ids == ["c", "c"]


def test_the_messages_api_s_tool_use_and_tool_result_render_as_chat_s(tokenizer: Any) -> None:
    request = {
        "system": "Use the calculator.",
        "tools": [
            {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression",
                "input_schema": CALCULATOR["function"]["parameters"],  # type: ignore[index]
            }
        ],
        "messages": [
            {"role": "user", "content": "What is 2+3?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "calculator",
                        "input": {"expression": "2+3"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "5"}],
            },
        ],
    }
    response = {"content": [{"type": "text", "text": "It is 5."}]}
    call = TrajectoryCall(id="c", api="messages", request=request, response=response)
    sample = Renderer(tokenizer, max_tokens=2048).render(Trajectory(id="m", calls=(call,)))
    assert not isinstance(sample, str), sample
    assert sample.token_ids == _own_rendering(tokenizer)


def test_tools_of_each_api_become_the_template_s_functions() -> None:
    params = {"type": "object"}
    expected = [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": params}}
    ]
    assert (
        request_tools(
            "messages", {"tools": [{"name": "f", "description": "d", "input_schema": params}]}
        )
        == expected
    )
    assert (
        request_tools(
            "responses",
            {
                "tools": [
                    {"type": "function", "name": "f", "description": "d", "parameters": params},
                    {"type": "web_search"},
                ]
            },
        )
        == expected
    )
    gemini = {
        "tools": [
            {"functionDeclarations": [{"name": "f", "description": "d", "parameters": params}]}
        ]
    }
    assert request_tools("gemini", gemini) == expected
    assert request_tools("chat.completions", {"tools": expected}) == expected


def test_a_responses_turn_of_text_and_function_calls_is_one_assistant_message() -> None:
    response = {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me see."}],
            },
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "g", "arguments": '{"x": 1}'},
        ]
    }
    call = TrajectoryCall(id="c", api="responses", request={"input": "hi"}, response=response)
    conversation = conversation_of(Trajectory(id="r", calls=(call,)))
    assert not isinstance(conversation, str)
    assert [m["role"] for m in conversation.messages] == ["user", "assistant"]
    reply = conversation.messages[1]
    assert reply["content"] == "Let me see."
    assert [c["function"]["name"] for c in reply.get("tool_calls", [])] == ["f", "g"]


def _chat(messages: list[dict[str, Any]], reply: dict[str, Any], **request: Any) -> Trajectory:
    call = TrajectoryCall(
        id="c",
        api="chat.completions",
        request={"messages": messages, **request},
        response={"choices": [{"message": reply}]},
    )
    return Trajectory(id="x", calls=(call,))


def test_what_cannot_be_rendered_is_a_counted_drop_with_its_reason(tokenizer: Any) -> None:
    own = _with_template(tokenizer, SMOLLM2_OWN)
    question = [{"role": "user", "content": "What is 2+3?"}]
    tool_reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
        ],
    }
    malformed = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": "{2+3"},
            }
        ],
    }
    long_text = " ".join(["hello world"] * 400)
    failed = TrajectoryCall(id="f", api="chat.completions", status="error")
    # a template that drops earlier turns' reasoning: not prefix-stable
    forgetful = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}(earlier)"
        "{% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    two_turns = [
        *question,
        {"role": "assistant", "content": "five"},
        {"role": "user", "content": "Sure?"},
    ]
    cases = [
        (
            own,
            _chat(question, {"role": "assistant", "content": "5"}, tools=[CALCULATOR]),
            "template renders no tools",
        ),
        (own, _chat(question, tool_reply), "template cannot render tool calls"),
        (tokenizer, _chat(question, malformed), "malformed tool call"),
        (
            tokenizer,
            _chat([{"role": "user", "content": long_text}], {"role": "assistant", "content": "ok"}),
            "longer than the context",
        ),
        (tokenizer, Trajectory(id="f", calls=(failed,)), "no reply"),
        (
            _with_template(tokenizer, forgetful),
            _chat(two_turns, {"role": "assistant", "content": "yes"}),
            "template not prefix-stable",
        ),
        (
            _with_template(tokenizer, "{{ raise_exception('roles must alternate') }}"),
            _chat(question, {"role": "assistant", "content": "5"}),
            "template cannot render",
        ),
    ]
    for tok, trajectory, reason in cases:
        samples, dropped = Renderer(tok, max_tokens=512).render_all([trajectory])
        assert samples == [] and dropped == {reason: 1}, (reason, dropped)
    # and a renderable one beside them is kept
    samples, dropped = Renderer(tokenizer, max_tokens=512).render_all(
        [_tool_call_trajectory(), Trajectory(id="f", calls=(failed,))]
    )
    assert len(samples) == 1 and dropped == {"no reply": 1}


def test_smollm2_s_tool_template_renders_the_trajectory_with_its_default_system(
    tokenizer: Any,
) -> None:
    tools = _with_template(tokenizer, SMOLLM2_TOOLS)
    trajectory = _chat(
        [{"role": "user", "content": "What is 2+3?"}],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "calculator",
                        "arguments": json.dumps({"expression": "2+3"}),
                    },
                }
            ],
        },
        tools=[CALCULATOR],
    )
    sample = Renderer(tools, max_tokens=2048).render(trajectory)
    assert not isinstance(sample, str), sample
    text = tools.decode(sample.token_ids)
    assert "You are a helpful AI assistant named SmolLM" in text and '"calculator"' in text
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
    assert _trained(tools, sample.token_ids, sample.loss_mask) == [call + "<|im_end|>"]
