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


SMOLLM2_TOOLS = with_default_system(HERMES_CHATML, SMOLLM2_SYSTEM)
