"""vLLM's own request extensions, passed through from translated APIs unchanged.

They mean the same whatever API the client speaks (a harness owner's way to steer the
served model, e.g. a seed or structured outputs), so the translators forward them.
"""

from collections.abc import Callable

from proxy.api.translate.shapes import ChatRequest
from store.json_types import JsonObject

VLLM_EXTRAS = (
    "seed",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "ignore_eos",
    "structured_outputs",
    "chat_template_kwargs",
)


def vllm_extras(
    body: JsonObject, keys: tuple[str, ...] = VLLM_EXTRAS, spelled: Callable[[str], str] = str
) -> ChatRequest:
    """The extensions `body` gives, under vLLM's names; `spelled`: how the body spells a
    name (Gemini's fields are camelCase once read)."""
    return {key: body[spelled(key)] for key in keys if body.get(spelled(key)) is not None}
