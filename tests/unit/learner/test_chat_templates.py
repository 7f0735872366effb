"""SmolLM2's tool-aware template (learner/chat_templates.py): a conversation without tools
renders exactly as SmolLM2's own template renders it; with tools, the tools reach the model
in the system turn, and tool calls and results render in the Hermes format vLLM's
`--tool-call-parser hermes` reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from learner.chat_templates import SMOLLM2_SYSTEM, SMOLLM2_TOOLS, with_default_system
from learner.tiny_model import CHAT_TEMPLATE as TINY_TEMPLATE

# SmolLM2-135M-Instruct's own template, as its GGUF carries it (what `models prepare` wrote
# before this one)
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    (text,), _ = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=True, **kwargs
    )
    return text


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name a colour."},
        ],
    ],
)
def test_without_tools_it_renders_as_smollm2s_own_template(
    messages: list[dict[str, Any]],
) -> None:
    assert render(SMOLLM2_TOOLS, messages) == render(SMOLLM2_OWN, messages)


def test_with_tools_the_tools_reach_the_model_behind_the_default_system_prompt() -> None:
    text = render(
        SMOLLM2_TOOLS, [{"role": "user", "content": "What is 17 * 23?"}], tools=[CALCULATOR]
    )
    assert text.startswith(f"<|im_start|>system\n{SMOLLM2_SYSTEM}\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(CALCULATOR)}\n</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n")
    assert (
        render(SMOLLM2_OWN, [{"role": "user", "content": "x"}], tools=[CALCULATOR]).count(
            "calculator"
        )
        == 0
    )  # what the model saw before: nothing of the tools


def test_a_tool_call_and_its_result_render_in_the_hermes_format() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "17 * 23"}'},
    }
    messages = [
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "391"},
    ]
    text = render(SMOLLM2_TOOLS, messages, tools=[CALCULATOR])
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": '
        '{"expression": "17 * 23"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in text


@pytest.mark.parametrize("template", [SMOLLM2_TOOLS, TINY_TEMPLATE], ids=["smollm2", "tiny"])
def test_a_tool_call_without_text_renders_alike_however_its_empty_content_comes(
    template: str,
) -> None:
    # vLLM hands the template "" content as a list of one empty text part: no blank line
    # before <tool_call> that the model never wrote
    call = {"type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    renders = {
        render(
            template,
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": content, "tool_calls": [call]},
            ],
            tools=[CALCULATOR],
        )
        for content in ("", None, [{"type": "text", "text": ""}], [])
    }
    (text,) = renders
    assert "<|im_start|>assistant\n<tool_call>\n" in text


def test_a_system_prompt_with_quotes_is_refused_rather_than_rendered_wrong() -> None:
    with pytest.raises(ValueError, match="quotes"):
        with_default_system("{{ x }}", "It's me")
