"""A calculator agent speaking the OpenAI chat-completions API over plain HTTP: the demo's
black-box harness.

It gets one question (first argument, else ONTHEJOB_PROMPT, else stdin), offers the model a
`calculator` tool, runs every tool call locally, and prints the model's final answer on
stdout. It knows only OPENAI_BASE_URL (pointed at the proxy, e.g. .../s/<run>/v1),
OPENAI_API_KEY (sent as a bearer token, as the openai SDK does) and the model name. If
ONTHEJOB_TASK is set it is sent as the X-Onthejob-Task header, so the proxy files the run
under that task key (what the reference grader looks answers up by). It exits 0 whenever it
got an answer, right or wrong; 1 if the model could not be reached.

Standard library only, on purpose: the demo starts it hundreds of times, and importing the
openai SDK cost 0.6 s of CPU per start on 2 cores, a third of the demo's rounds. The suite
drives the proxy with the official SDKs elsewhere. The HTTP client and the reading of the
question and the environment are learner/harness_client.py, shared with the other harnesses.

Run: python -m learner.demo.harnesses.calc_agent "How many minutes are in 3 hours?"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from learner.demo.tasks import CALCULATOR_TOOL, calculate, format_number
from learner.harness_client import Complete, ModelError, connect, question

if TYPE_CHECKING:  # standard library only at run time
    from store.json_types import JsonObject

TIMEOUT_S = 120  # seconds a model call may take


def run_tool(name: str, arguments: str) -> str:
    """The tool's answer as the model will read it; mistakes become short error texts."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        expression = json.loads(arguments)["expression"]
        return format_number(calculate(str(expression)))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def solve(
    complete: Complete,
    prompt: str,
    *,
    max_turns: int = 3,
    max_tokens: int = 64,
    temperature: float = 1.0,
) -> str:
    """Ask, run the tool calls, ask again, until the model answers without calling a tool."""
    messages: list[JsonObject] = [{"role": "user", "content": prompt}]
    answer = ""
    for _ in range(max_turns):
        message = complete(
            messages, tools=[CALCULATOR_TOOL], max_tokens=max_tokens, temperature=temperature
        )
        answer = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if not calls:
            return answer
        messages.append({k: v for k, v in message.items() if v is not None})
        for call in calls:
            function = call.get("function") or {}
            result = run_tool(function.get("name", ""), function.get("arguments", ""))
            messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
    return answer  # out of turns: the last thing it said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    prompt = question(parser, args.prompt, os.environ)
    complete = connect(parser, args.model, os.environ, timeout_s=TIMEOUT_S)
    try:
        answer = solve(
            complete,
            prompt,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    except ModelError as exc:
        print(f"calc_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(answer.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
