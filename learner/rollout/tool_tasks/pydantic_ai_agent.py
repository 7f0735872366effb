"""The tool tasks driven by pydantic-ai (a third-party agent framework, unchanged): its Agent
on the OpenAI chat-completions API at the proxy, with the family's three tools as its tools.

pydantic-ai runs the loop: it sends the question with the tools, runs the calls, sends the
results back, and ends on a reply without a call (the agent's output, printed on stdout).
Each tool is `Tool.from_schema` with the tool's own JSON schema (pydantic-ai sends it strict:
`additionalProperties: false`, `"strict": true`); pydantic-ai skips schema validation for
such a tool, so our tool answers a wrong argument with its "Error: ..." result. Arguments
that are not a JSON object never reach the tool: pydantic-ai answers them itself, with the
tool result `{"error": [...validation errors...]}` and the call sent back as
`{"INVALID_JSON": "<the text>"}` (both read by the next-turn signals: store/next_turn.py,
store/tool_arguments.py), once a tool before it gives up (its default retries). It sends
arguments back as compact JSON. The request fields are pydantic-ai's own; `--max-tokens`
and `--temperature` are its model settings (`max_completion_tokens`, `temperature`),
`--max-turns` its request limit. Command line, environment and output: frameworks.py
(counts prefix `pydantic_ai_agent`).

Run: onthejob rollout --proxy URL --tasks tools-train.jsonl -- \\
         python -m learner.rollout.tool_tasks.pydantic_ai_agent "{prompt}"
Needs pydantic-ai-slim[openai] (the dev extra).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from pydantic_ai import Agent, Tool
from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from learner.rollout.tool_tasks.frameworks import (
    Counts,
    Settings,
    ToolSpec,
    failed,
    finish,
    proxy_client,
    settings,
    tool_specs,
)

PREFIX = "pydantic_ai_agent"


def framework_tool(spec: ToolSpec, counts: Counts) -> Tool[Any]:
    def call(**arguments: Any) -> str:
        return counts.run(spec.name, arguments)

    return Tool.from_schema(call, spec.name, spec.description, dict(spec.parameters))


async def solve(run: Settings, counts: Counts) -> str | None:
    """The agent's final answer; UsageLimitExceeded out of turns, UnexpectedModelBehavior
    out of retries. The model calls made are counted either way."""
    model = OpenAIChatModel(
        run.model, provider=OpenAIProvider(openai_client=proxy_client(os.environ))
    )
    agent = Agent(
        model,
        system_prompt=run.system or (),
        tools=[framework_tool(spec, counts) for spec in tool_specs()],
        output_type=str,
    )
    limits = UsageLimits(request_limit=run.max_turns)
    model_settings = ModelSettings(max_tokens=run.max_tokens, temperature=run.temperature)
    async with agent.iter(run.prompt, usage_limits=limits, model_settings=model_settings) as it:
        try:
            async for _ in it:
                pass
        finally:
            counts.turns = it.usage.requests
    return it.result.output if it.result is not None else None


def main(argv: list[str] | None = None) -> int:
    run = settings(
        "python -m learner.rollout.tool_tasks.pydantic_ai_agent",
        (__doc__ or "").splitlines()[0],
        argv,
    )
    counts = Counts()
    try:
        answer = asyncio.run(solve(run, counts))
    except ModelAPIError as exc:  # before UnexpectedModelBehavior: some errors are both
        return failed(PREFIX, exc)
    except (UsageLimitExceeded, UnexpectedModelBehavior) as exc:
        print(f"{PREFIX}: gave up: {exc}", file=sys.stderr)
        answer = None
    return finish(PREFIX, counts, answer)


if __name__ == "__main__":
    sys.exit(main())
