"""A scripted stand-in for vLLM that answers a harness's first call with a tool call.

The tiny random model cannot be made to call a harness's own tools on demand, so this
upstream plays the model: it renders the chat request with the tiny model's real tokenizer
and chat template (prompt token ids, as vLLM would), decides the reply with a script, and
returns the reply's tokens as exactly what the template renders for that assistant message
(completion token ids). If the proxy shows the model the conversation the model produced,
each call's prompt then starts with the previous call's prompt and completion, token for
token, and the learner can train on the tool loop as one sequence; if a translation changes
an echoed tool call by so much as a space, it cannot.

Chat completions only (streamed or whole), with `return_token_ids`, logprobs and usage.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from proxy.upstream.sampling import NEUTRAL
from tests.support.threaded_upstream import ThreadedUpstream

# the reply for a call, given its chat messages: an assistant message
Script = Callable[[list[dict[str, Any]]], dict[str, Any]]
LOGPROB = -0.25


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant message calling one tool, arguments serialised as vLLM's parsers do."""
    dumped = json.dumps(arguments, ensure_ascii=False)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": dumped}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def has_tool_result(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" for m in messages)


class ToolLoopUpstream(ThreadedUpstream):
    def __init__(self, tokenizer: Any, script: Script, *, model: str = "tiny") -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.script = script
        self.model = model
        self.requests: list[dict[str, Any]] = []

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/chat/completions/render", self._defaults)

    async def _defaults(self, request: web.Request) -> web.Response:
        """What vLLM's /render says of a request that sets nothing: no sampling defaults."""
        return web.json_response({"sampling_params": NEUTRAL})

    def _render(self, messages: list[dict[str, Any]], tools: Any, *, prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=prompt, tokenize=False
        )

    def _ids(self, text_: str) -> list[int]:
        return list(self.tokenizer(text_, add_special_tokens=False)["input_ids"])

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The chat completion for a request (what the streamed chunks add up to)."""
        messages, tools = body["messages"], body.get("tools")
        reply = self.script(messages)
        prompt = self._render(messages, tools, prompt=True)
        whole = self._render([*messages, reply], tools, prompt=False)
        assert whole.startswith(prompt), "the template must render the reply after the prompt"
        # the turn as the model writes it: up to its end-of-turn token, not the newline after
        completion = whole[len(prompt) :].removesuffix("\n")
        prompt_ids, completion_ids = self._ids(prompt), self._ids(completion)
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        return {
            "id": f"chatcmpl-scripted-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1,
            "model": self.model,
            "prompt_token_ids": prompt_ids,
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "logprobs": {"content": [self._logprob(i) for i in completion_ids]},
                    "finish_reason": finish,
                    "token_ids": completion_ids,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
        }

    def _logprob(self, token_id: int) -> dict[str, Any]:
        token = self.tokenizer.decode([token_id])
        return {
            "token": token,
            "logprob": LOGPROB,
            "bytes": list(token.encode()),
            "top_logprobs": [],
        }

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        answer = self.answer(body)
        if not body.get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in _chunks(answer):
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


def _chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer as vLLM streams it: role and prompt ids, the whole delta with its token
    ids and logprobs, the finish reason, then usage."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {key: answer[key] for key in ("id", "object", "created", "model")}
    head["object"] = "chat.completion.chunk"
    delta: dict[str, Any] = {}
    if message.get("content"):
        delta["content"] = message["content"]
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]

    def chunk(choice_fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "finish_reason": None, **choice_fields}], **extra}

    return [
        chunk(
            {"delta": {"role": "assistant", "content": ""}},
            prompt_token_ids=answer["prompt_token_ids"],
        ),
        chunk({"delta": delta, "logprobs": choice["logprobs"], "token_ids": choice["token_ids"]}),
        chunk({"delta": {}, "finish_reason": choice["finish_reason"]}),
        {**head, "choices": [], "usage": answer["usage"]},
    ]
