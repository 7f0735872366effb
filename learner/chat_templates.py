"""Chat templates that render tools, for the models `onthejob models prepare` ships.

SmolLM2-135M-Instruct's own template (ChatML with a default system prompt) ignores `tools`:
served as it comes, a harness's tools never reach the model. Its tool-aware template is the
tiny test model's (learner/tiny_model.py: Qwen2.5-style ChatML with Hermes tool calling,
which vLLM's `--tool-call-parser hermes` reads) behind SmolLM2's default system prompt. A
conversation without tools renders exactly as SmolLM2's own template renders it, so the
recorded tokens of tool-less traffic do not change
(tests/unit/learner/test_chat_templates.py).

With tools, the system turn holds the system prompt (the default one, when the conversation
has none) and then the tools' signatures; an assistant's tool call is
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`; tool results go back in one
user turn, each inside `<tool_response>` tags.
"""

from __future__ import annotations

from learner.tiny_model import CHAT_TEMPLATE as HERMES_CHATML

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def with_default_system(template: str, system: str) -> str:
    """``template`` rendering ``system`` as the system prompt of a conversation without one."""
    if "'" in system or "\\" in system:
        raise ValueError("a default system prompt with quotes or backslashes needs escaping")
    return (
        "{%- if messages and messages[0].role != 'system' -%}"
        "{%- set messages = [{'role': 'system', 'content': '" + system + "'}] + messages -%}"
        "{%- endif -%}" + template
    )


# An assistant turn with tool calls starts its text on a line of its own only where it has
# text. vLLM hands the template an assistant's "" content as a list of one empty text part,
# which the tiny model's template takes for text: it put a blank line before <tool_call>
# that the model never wrote, so the next call's prompt did not start with the tokens the
# model sampled (tests/e2e/test_real_model_vllm.py). Here the test is on the text itself.
_CONTENT_IF_ANY = "{%- if m.content -%}{{- '\\n' + text(m.content) -}}{%- endif -%}"
_TEXT_IF_ANY = "{%- set said = text(m.content) -%}{%- if said -%}{{- '\\n' + said -}}{%- endif -%}"


def _text_if_any(template: str) -> str:
    if template.count(_CONTENT_IF_ANY) != 1:
        raise ValueError("the Hermes template no longer has its assistant-content test")
    return template.replace(_CONTENT_IF_ANY, _TEXT_IF_ANY)


SMOLLM2_TOOLS = with_default_system(_text_if_any(HERMES_CHATML), SMOLLM2_SYSTEM)
