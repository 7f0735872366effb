"""How many tokens a chat request's prompt is, counted by vLLM's own `/tokenize`.

The upstream renders the chat template and tokenises exactly as it will for the request,
so the count is the prompt the model sees. Used where the proxy must know it before it
sends: `/v1/messages/count_tokens`, the trigger of a context edit, and an output limit too
large for the room the prompt leaves. Not on the path of ordinary calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from proxy.base.errors import ProxyError, UpstreamUnavailable, upstream_error_message
from proxy.upstream.replicas import UPSTREAM_READ_ERRORS, UpstreamPool
from store.json_types import JsonObject

# the chat request fields that decide the rendered prompt
_PROMPT_FIELDS = (
    "model",
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
)


class CountRefused(ProxyError):
    """The upstream answered /tokenize with an error (its status and message)."""

    type = "upstream_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class PromptCount:
    tokens: int
    # the served model's context length, when the upstream says (vLLM does)
    context: int | None


def tokenize_body(chat: JsonObject) -> JsonObject:
    """The /tokenize request for a chat request's prompt."""
    body = {key: chat[key] for key in _PROMPT_FIELDS if chat.get(key) is not None}
    body.setdefault("add_generation_prompt", True)
    if chat.get("reasoning_effort") is not None:
        # vLLM hands reasoning_effort to the template too; /tokenize takes it as a kwarg
        kwargs = {"reasoning_effort": chat["reasoning_effort"]}
        body["chat_template_kwargs"] = {**kwargs, **(body.get("chat_template_kwargs") or {})}
    return body


async def count_prompt(
    pool: UpstreamPool, chat: JsonObject, client_headers: Mapping[str, str]
) -> PromptCount:
    """The prompt's token count; raises ProxyError (CountRefused for an upstream error)."""
    _, response = await pool.open(
        "POST",
        "/tokenize",
        body=orjson.dumps(tokenize_body(chat)),
        headers=pool.headers(client_headers),
        sticky_key=None,
    )
    try:
        raw = await response.read()
    except UPSTREAM_READ_ERRORS as exc:
        raise UpstreamUnavailable(f"upstream broke off while counting tokens: {exc}") from exc
    finally:
        await pool.release(response)
    if response.status != 200:
        raise CountRefused(response.status, upstream_error_message(raw))
    try:
        answer = orjson.loads(raw)
        count = int(answer["count"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UpstreamUnavailable("upstream's /tokenize answered without a token count") from exc
    context = answer.get("max_model_len")
    return PromptCount(count, context if isinstance(context, int) else None)
