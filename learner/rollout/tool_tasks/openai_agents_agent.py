"""The tool tasks driven by the OpenAI Agents SDK (`openai-agents`, a third-party agent
framework, unchanged): its Agent and Runner on the chat-completions API at the proxy
(OpenAIChatCompletionsModel), with the family's three tools as its function tools.

The SDK's Runner runs the loop: it sends the question with the tools, runs the calls, sends
the results back, and ends on a reply without a call (the final output, printed on stdout).
Each tool is a `FunctionTool` with the tool's own JSON schema (not strict: the SDK would
rewrite a strict one) whose invoker hands the model's arguments, JSON text as they came, to
`tools.run_tool`: arguments that are not JSON, a wrong argument or an entry the database
lacks come back as the tool's "Error: ..." result. A call of a tool that does not exist ends
the run in the SDK (ModelBehaviorError: no answer). The request fields are the SDK's own;
`--max-tokens` and `--temperature` are its model settings, `--max-turns` the Runner's.
Tracing is off: it would export to OpenAI's servers. Command line, environment and output:
frameworks.py (counts prefix `openai_agents_agent`).

Run: onthejob rollout --proxy URL --tasks tools-train.jsonl -- \\
         python -m learner.rollout.tool_tasks.openai_agents_agent "{prompt}"
Needs openai-agents (the dev extra).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import openai
from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunHooks,
    Runner,
    set_tracing_disabled,
)

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

PREFIX = "openai_agents_agent"


def framework_tool(spec: ToolSpec, counts: Counts) -> FunctionTool:
    async def invoke(_context: Any, arguments: str) -> str:
        return counts.run(spec.name, arguments)

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=dict(spec.parameters),
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


class TurnCounter(RunHooks[None]):
    """Counts the model calls as they end, also in a run the SDK gives up on."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.counts.turns += 1


async def solve(run: Settings, counts: Counts) -> str | None:
    """The agent's final answer; None when it ran out of turns; ModelBehaviorError when
    the SDK gave up on the model's reply."""
    agent: Agent[None] = Agent(
        name="tool_tasks",
        instructions=run.system,
        model=OpenAIChatCompletionsModel(run.model, openai_client=proxy_client(os.environ)),
        model_settings=ModelSettings(max_tokens=run.max_tokens, temperature=run.temperature),
        tools=[framework_tool(spec, counts) for spec in tool_specs()],
    )
    config = RunConfig(tracing_disabled=True)
    hooks = TurnCounter(counts)
    try:
        result = await Runner.run(
            agent, run.prompt, max_turns=run.max_turns, run_config=config, hooks=hooks
        )
    except MaxTurnsExceeded:
        return None
    output = result.final_output
    return output if isinstance(output, str) else str(output)


def main(argv: list[str] | None = None) -> int:
    run = settings(
        "python -m learner.rollout.tool_tasks.openai_agents_agent",
        (__doc__ or "").splitlines()[0],
        argv,
    )
    set_tracing_disabled(True)
    counts = Counts()
    try:
        answer = asyncio.run(solve(run, counts))
    except openai.OpenAIError as exc:
        return failed(PREFIX, exc)
    except ModelBehaviorError as exc:
        print(f"{PREFIX}: gave up: {exc}", file=sys.stderr)
        answer = None
    return finish(PREFIX, counts, answer)


if __name__ == "__main__":
    sys.exit(main())
