"""What the tool tasks' third-party harnesses share (pydantic_ai_agent.py,
openai_agents_agent.py): the command line agent.py has, the OpenAI client pointed at the
proxy, the family's tools as one function each framework wraps, and how a run ends.

Each framework runs its own tool loop unchanged; only its tools are ours. A tool gets the
model's arguments as the framework hands them over (JSON text, or the object the framework
parsed) and answers with `tools.run_tool`'s content verbatim: a result, or "Error: ..." as
the tool result, never an exception, so the model reads what went wrong and the next-turn
signals count a failed tool call (store/next_turn.py). A call the framework itself turns
down before any tool runs is answered in the framework's own words.

Environment, as agent.py: OPENAI_BASE_URL (the proxy, under the run's session key),
OPENAI_API_KEY (a placeholder when unset), ONTHEJOB_TASK (sent as X-Onthejob-Task),
ONTHEJOB_MODEL (the model name, else "default"), ONTHEJOB_PROMPT (the question, when no
argument gives it). stdout: the final answer; stderr: one line of counts,
`<prefix>: {"turns": ..., "tool_calls": ..., "malformed": ..., "failed": ...,
"answered": ...}`. Exit 0 whenever the model was reached, answer or not (out of turns: no
answer); 1 when a model call failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from openai import AsyncOpenAI

from learner.harness_client import question
from learner.rollout.tool_tasks.agent import add_run_arguments
from learner.rollout.tool_tasks.tools import FAILED, MALFORMED, TOOLS, run_tool

if TYPE_CHECKING:
    from store.json_types import JsonObject, JsonValue

TIMEOUT_S = 300  # seconds a model call may take


@dataclass(frozen=True)
class ToolSpec:
    """One of the family's tools as a framework registers it."""

    name: str
    description: str
    parameters: JsonObject  # its JSON schema, as tools.TOOLS says it


def tool_specs() -> list[ToolSpec]:
    specs = []
    for tool in TOOLS:
        function = tool["function"]
        assert isinstance(function, dict)
        name, description, parameters = (
            function["name"],
            function["description"],
            function["parameters"],
        )
        assert isinstance(name, str) and isinstance(description, str)
        assert isinstance(parameters, dict)
        specs.append(ToolSpec(name, description, parameters))
    return specs


@dataclass
class Counts:
    """What the tools saw and how the run went: the stderr summary line."""

    turns: int = 0  # model calls, as the framework counts them
    tool_calls: int = 0  # calls that reached a tool of ours
    malformed: int = 0  # ... that did not fit its definition
    failed: int = 0  # ... well-formed, that it could not answer
    answered: bool = False

    def run(self, name: str, arguments: str | Mapping[str, JsonValue] | None) -> str:
        """The tool result of one call: what a framework's tool returns to the model."""
        result = run_tool(name, arguments)
        self.tool_calls += 1
        self.malformed += result.error == MALFORMED
        self.failed += result.error == FAILED
        return result.content

    def summary(self, prefix: str) -> str:
        return f"{prefix}: {json.dumps(asdict(self))}"


@dataclass(frozen=True)
class Settings:
    prompt: str
    model: str
    max_turns: int
    max_tokens: int
    temperature: float
    system: str | None


def settings(prog: str, description: str, argv: list[str] | None) -> Settings:
    """The command line of agent.py; a usage error (exit 2) without a question or without
    OPENAI_BASE_URL."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    if args.max_turns < 1 or args.max_tokens < 1:
        parser.error("--max-turns and --max-tokens must be at least 1")
    if not os.environ.get("OPENAI_BASE_URL"):
        parser.error("OPENAI_BASE_URL is not set (the proxy's URL, e.g. http://127.0.0.1:8080/v1)")
    return Settings(
        prompt=question(parser, args.prompt, os.environ),
        model=args.model,
        max_turns=args.max_turns,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        system=args.system,
    )


def proxy_client(environ: Mapping[str, str]) -> AsyncOpenAI:
    """The OpenAI SDK client a framework sends its chat completions through: the proxy's base
    URL and the run's key; no retries (a failed call is the run's failure, not hidden)."""
    task = environ.get("ONTHEJOB_TASK")
    return AsyncOpenAI(
        base_url=environ["OPENAI_BASE_URL"],
        api_key=environ.get("OPENAI_API_KEY") or "not-needed",
        default_headers={"X-Onthejob-Task": task} if task else None,
        max_retries=0,
        timeout=TIMEOUT_S,
    )


def finish(prefix: str, counts: Counts, answer: str | None) -> int:
    """Report a run that reached the model: counts to stderr, the answer to stdout."""
    counts.answered = answer is not None
    print(counts.summary(prefix), file=sys.stderr)
    print((answer or "").strip())
    return 0


def failed(prefix: str, error: BaseException) -> int:
    print(f"{prefix}: the model failed: {type(error).__name__}: {error}", file=sys.stderr)
    return 1
