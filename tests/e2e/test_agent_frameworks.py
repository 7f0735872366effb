"""A real third-party agent framework (pydantic-ai) run end to end through each API.

The random tiny model cannot decide to use a tool, so a transport under the framework's
own SDK client steers it with vLLM's structured outputs: first a forced `add` call, then,
once the tool result is in the conversation, a forced final answer. The framework itself
is untouched: it makes its calls, runs the tool and sends the result back as it would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from tests.support.forcing import CALL_ADD_REGEX
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]

ANSWER = "The answer is 3."


def _has_tool_result(body: dict[str, Any]) -> bool:
    for message in body.get("messages") or []:
        if message.get("role") == "tool":
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            return True
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
    )


def _steer(content: bytes) -> bytes:
    body = orjson.loads(content)
    regex = ANSWER.replace(".", r"\.") if _has_tool_result(body) else CALL_ADD_REGEX
    body["structured_outputs"] = {"regex": regex}
    for tool in body.get("tools") or []:
        # vLLM's strict tool grammar would take precedence over the steering regex
        tool.pop("strict", None)
        if isinstance(tool.get("function"), dict):
            tool["function"].pop("strict", None)
    return orjson.dumps(body)


class Steering(httpx.AsyncBaseTransport):
    def __init__(self, module: Any) -> None:
        self.module = module
        self.inner = module.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        if request.method == "POST":
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
            request = self.module.Request(
                request.method, request.url, headers=headers, content=_steer(request.content)
            )
        return await self.inner.handle_async_request(request)


def _model(api: str, base_url: str, model_name: str) -> Any:
    if api == "messages":
        client = anthropic.AsyncAnthropic(
            base_url=base_url,
            api_key="x",
            max_retries=0,
            http_client=httpx2.AsyncClient(transport=Steering(httpx2)),
        )
        return AnthropicModel(model_name, provider=AnthropicProvider(anthropic_client=client))
    client = openai.AsyncOpenAI(
        base_url=base_url + "/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=Steering(httpx)),
    )
    provider = OpenAIProvider(openai_client=client)
    if api == "responses":
        return OpenAIResponsesModel(model_name, provider=provider)
    return OpenAIChatModel(model_name, provider=provider)


@pytest.mark.parametrize("api", ["chat.completions", "responses", "messages"])
def test_pydantic_ai_agent_run_is_one_recorded_trajectory(vllm, pg_url, start_proxy, api):
    from store import db

    db.upgrade(pg_url)
    proxy = start_proxy([vllm.url], pg_url)
    calls_made: list[tuple[int, int]] = []
    agent = Agent(_model(api, proxy.url, vllm.model_name), system_prompt="Use the tools.")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls_made.append((a, b))
        return a + b

    result = asyncio.run(agent.run("What is 1 + 2?", model_settings={"max_tokens": 80}))
    assert result.output.strip() == ANSWER
    assert calls_made == [(1, 2)]

    engine = db.make_engine(pg_url)
    try:
        wait_for_calls(engine, 2)
        (trajectory,) = export(engine)  # no session key: stitched by the conversation
        assert [c["api"] for c in trajectory["calls"]] == [api, api]
        assert all(c["capture_complete"] for c in trajectory["calls"])
        first, second = trajectory["calls"]
        assert len(second["prompt_token_ids"]) > len(first["prompt_token_ids"])
    finally:
        engine.dispose()
