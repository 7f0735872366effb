"""Re-emit a whole chat completion as a chunk stream (for upstreams whose streams lose tokens).

Pure function; the chunks follow the shape vLLM streams: a role chunk, the content, each
tool call whole, a finish chunk per choice, and the usage chunk when the client asked.
"""

from __future__ import annotations

from typing import Any

from proxy.base.capture import REASONING_KEYS, ClientAsked
from store.json_types import JsonObject


def response_to_chunks(data: JsonObject, asked: ClientAsked) -> list[JsonObject]:
    head = {
        "id": data.get("id"),
        "object": "chat.completion.chunk",
        "created": data.get("created"),
        "model": data.get("model"),
    }
    chunks: list[JsonObject] = []
    fingerprint = data.get("system_fingerprint")

    def chunk(choice: JsonObject, **extra: Any) -> JsonObject:
        body = {**head, "choices": [choice], **extra}
        chunks.append(body)
        return body

    for raw in data.get("choices") or []:
        index = raw.get("index", 0)
        message = raw.get("message") or {}
        first = chunk(
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        )
        if asked.token_ids and not chunks[:-1]:
            first["prompt_token_ids"] = data.get("prompt_token_ids")
        delta: JsonObject = {}
        for key in REASONING_KEYS:
            if message.get(key):
                delta[key] = message[key]
        if message.get("content"):
            delta["content"] = message["content"]
        body: JsonObject = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": None,
        }
        if asked.logprobs:
            body["logprobs"] = raw.get("logprobs")
        if asked.token_ids:
            body["token_ids"] = raw.get("token_ids")
        if delta or asked.token_ids or asked.logprobs:
            chunk(body)
        for position, call in enumerate(message.get("tool_calls") or []):
            chunk(
                {
                    "index": index,
                    "delta": {"tool_calls": [{"index": position, **call}]},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
        finishing = chunk(
            {
                "index": index,
                "delta": {},
                "logprobs": None,
                "finish_reason": raw.get("finish_reason"),
            }
        )
        # vLLM puts the fingerprint on the finishing chunks, or on the usage chunk if sent
        if fingerprint is not None and not asked.stream_usage:
            finishing["system_fingerprint"] = fingerprint
    if asked.stream_usage and data.get("usage") is not None:
        usage_chunk = {**head, "choices": [], "usage": data["usage"]}
        if fingerprint is not None:
            usage_chunk["system_fingerprint"] = fingerprint
        chunks.append(usage_chunk)
    return chunks
