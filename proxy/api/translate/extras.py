"""vLLM's own request extensions, passed through from translated APIs unchanged.

They mean the same whatever API the client speaks (a harness owner's way to steer the
served model, e.g. a seed or structured outputs), so the translators forward them.
"""

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


def vllm_extras(body: dict) -> dict:
    return {key: body[key] for key in VLLM_EXTRAS if body.get(key) is not None}
