"""A calculator agent written against the openai SDK: the demo's black-box harness.

It gets one question (first argument, else ONTHEJOB_PROMPT, else stdin), offers the model a
`calculator` tool, runs every tool call locally, and prints the model's final answer on
stdout. It knows only OPENAI_BASE_URL (pointed at the proxy, e.g. .../s/<run>/v1) and the
model name. If ONTHEJOB_TASK is set it is sent as the X-Onthejob-Task header, so the
proxy files the run under that task key (what the reference grader looks answers up by).
It exits 0 whenever it got an answer, right or wrong; 1 if the model could not be reached.
Run: python -m learner.demo.harnesses.calc_agent "How many minutes are in 3 hours?"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import openai

from learner.demo.tasks import CALCULATOR_TOOL, calculate, format_number


def question(args: argparse.Namespace) -> str:
    if args.prompt:
        return str(args.prompt)
    return os.environ.get("ONTHEJOB_PROMPT") or sys.stdin.read()


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
    api: openai.OpenAI,
    model: str,
    prompt: str,
    *,
    max_turns: int = 3,
    max_tokens: int = 64,
    temperature: float = 1.0,
) -> str:
    """Ask, run the tool calls, ask again, until the model answers without calling a tool."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    answer = ""
    for _ in range(max_turns):
        reply = api.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=[CALCULATOR_TOOL],  # type: ignore[list-item]
            max_tokens=max_tokens,
            temperature=temperature,
        )
        message = reply.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            return answer
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = getattr(call, "function", None)
            result = run_tool(function.name, function.arguments) if function else "error"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer  # out of turns: the last thing it said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    prompt = question(args).strip()
    if not prompt:
        parser.error("no question given (argument, ONTHEJOB_PROMPT or stdin)")
    task = os.environ.get("ONTHEJOB_TASK")
    api = openai.OpenAI(
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        max_retries=0,
        default_headers={"X-Onthejob-Task": task} if task else None,
    )
    try:
        answer = solve(
            api,
            args.model,
            prompt,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    except openai.APIError as exc:
        print(f"calc_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(answer.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
