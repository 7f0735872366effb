"""Fan-out: sample N completions for a single-turn request, answer with one, record all N.

Pure functions over parsed JSON, no I/O. Invariant: the client of a fanned-out request gets
exactly what vLLM sends for the same request with n=1 -- one choice, index 0, usage counting
that choice only, and in streams only choice 0's chunks -- while every sampled choice is
recorded as its own trajectory, the N sharing one group key (a GRPO group).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.base.capture import Capture
from proxy.generation.dialect import StreamWriter
from store.json_types import JsonObject

# messages a single-turn request may carry besides its one user message
_INSTRUCTION_ROLES = ("system", "developer")


def fanout_eligible(body: JsonObject) -> bool:
    """Whether a chat-completions request may be fanned out.

    Single-turn (optional system/developer messages and exactly one user message, nothing
    the model said before, no tool results), the client did not ask for several choices,
    and the N samples can differ and be told apart: not greedy (temperature 0 samples N
    identical answers), not beam search, not hiding token ids (`include_reasoning: false`).
    """
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        return False
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    users = 0
    for message in messages:
        if not isinstance(message, dict):
            return False
        role = message.get("role")
        if role == "user":
            users += 1
        elif role not in _INSTRUCTION_ROLES:
            return False
    if users != 1:
        return False
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool):
        if temperature == 0:
            return False
    return not body.get("use_beam_search") and body.get("include_reasoning") is not False


def single_usage(usage: Any, completion_tokens: int | None) -> Any:
    """Usage as an n=1 request producing `completion_tokens` would report it."""
    if not isinstance(usage, dict) or completion_tokens is None:
        return usage
    out = dict(usage)
    out["completion_tokens"] = completion_tokens
    prompt = usage.get("prompt_tokens")
    if "total_tokens" in usage and isinstance(prompt, int):
        out["total_tokens"] = prompt + completion_tokens
    return out


def choice_response(data: JsonObject, index: int, completion_tokens: int | None) -> JsonObject:
    """A whole chat response of several choices, as if only choice `index` had been sampled.

    The choice becomes the only one, at index 0; usage counts its `completion_tokens`.
    `data` is not changed (the result is a shallow copy, safe to strip in place).
    """
    out = dict(data)
    chosen = [c for c in data.get("choices") or [] if c.get("index", 0) == index]
    out["choices"] = [{**c, "index": 0} for c in chosen[:1]]
    if "usage" in data:
        out["usage"] = single_usage(data["usage"], completion_tokens)
    return out


def split_capture(capture: Capture) -> list[tuple[int, Capture]]:
    """One capture per sampled choice, (upstream index, capture), in index order.

    Each holds its choice as the only one (index 0) with the shared prompt. Upstream usage
    only counts all choices together: if the whole capture agrees with it, each part's
    count is its own token count; if not, which choice lost tokens is unknown, so every
    part is left without a count and is incomplete (never trained on).
    """
    complete = capture.complete
    parts = []
    for choice in capture.choices:
        part = Capture(
            prompt_token_ids=capture.prompt_token_ids,
            choices=[replace(choice, index=0)],
            prompt_tokens=capture.prompt_tokens,
            completion_tokens=len(choice.token_ids) if complete else None,
        )
        parts.append((choice.index, part))
    return parts


class ChoiceZeroChunks:
    """The upstream's n=N chat stream reduced to what an n=1 stream sends.

    vLLM streams one choice per chunk, indices interleaved, one role chunk (with the prompt
    token ids) per index, and a final usage chunk summed over all choices. Chunks of other
    indices are dropped; the final usage chunk is rewritten to count choice 0's tokens
    (counted from the token ids the proxy always asks for). Per-chunk usage
    (continuous_usage_stats) is already per choice in vLLM and passes as is.
    """

    def __init__(self) -> None:
        self.tokens = 0

    def feed(self, chunk: JsonObject) -> JsonObject | None:
        """The chunk to pass on (maybe a new dict), or None to drop it."""
        choices = chunk.get("choices")
        if choices:
            kept = [c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0]
            if not kept:
                return None
            for choice in kept:
                if isinstance(choice.get("token_ids"), list):
                    self.tokens += len(choice["token_ids"])
            return chunk if len(kept) == len(choices) else {**chunk, "choices": kept}
        if chunk.get("usage"):
            return {**chunk, "usage": single_usage(chunk["usage"], self.tokens)}
        return chunk


class FanoutStream:
    """A StreamWriter that passes only choice 0 of a fanned-out stream to `inner`."""

    def __init__(self, inner: StreamWriter) -> None:
        self.inner = inner
        self.chunks = ChoiceZeroChunks()

    def feed(self, chunk: JsonObject) -> bytes:
        kept = self.chunks.feed(chunk)
        return b"" if kept is None else self.inner.feed(kept)

    def end(self) -> bytes:
        return self.inner.end()

    def broken(self, message: str) -> bytes:
        return self.inner.broken(message)

    def upstream_error(self, event: bytes, message: str) -> bytes:
        return self.inner.upstream_error(event, message)
