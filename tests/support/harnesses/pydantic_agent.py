"""A pydantic-ai agent (a real third-party framework) with one tool, `add`, on the OpenAI
chat API; prints the agent's final output. Its base URL comes from OPENAI_BASE_URL.

Test steering (ONTHEJOB_HARNESS_FORCE_ADD=1): a transport under the framework's own client
adds vLLM structured outputs to each request, forcing an `add` call first and, once the tool
result is in the conversation, a final answer matching ONTHEJOB_HARNESS_FINAL_REGEX.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import httpx
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support.harnesses.common import max_tokens, prompt_from

CALL_ADD = r'<tool_call>\{"name": "add", "arguments": \{"a": [1-3], "b": [1-3]\}\}</tool_call>'


class Steering(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            answered = any(m.get("role") == "tool" for m in body.get("messages", []))
            regex = (
                os.environ.get("ONTHEJOB_HARNESS_FINAL_REGEX", "[0-9]") if answered else CALL_ADD
            )
            body["structured_outputs"] = {"regex": regex}
            for tool in body.get("tools") or []:  # a strict tool grammar would win over it
                tool.get("function", {}).pop("strict", None)
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = httpx.Request(
                request.method, request.url, headers=headers, content=json.dumps(body).encode()
            )
        return await self.inner.handle_async_request(request)


async def run(prompt: str) -> str:
    steer = os.environ.get("ONTHEJOB_HARNESS_FORCE_ADD") == "1"
    http_client = httpx.AsyncClient(transport=Steering()) if steer else None
    client = AsyncOpenAI(max_retries=0, http_client=http_client)
    model_id = os.environ.get("ONTHEJOB_HARNESS_MODEL") or (await client.models.list()).data[0].id
    agent = Agent(OpenAIChatModel(model_id, provider=OpenAIProvider(openai_client=client)))

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    result = await agent.run(prompt, model_settings={"max_tokens": max_tokens()})
    output: Any = result.output
    return str(output)


def main() -> int:
    print(asyncio.run(run(prompt_from(sys.argv[1:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
