"""The tool tasks' bundled agent: a tool loop over the OpenAI chat-completions API, plain HTTP.

It gets one question (first argument, else ONTHEJOB_PROMPT, else stdin), offers the model
the family's three tools (calculator, convert, lookup), runs every tool call locally
(tools.py), sends the results back, and prints the model's final answer on stdout once it
answers without calling a tool. A malformed call (arguments that are not JSON, an unknown
tool, a wrong argument) gets a tool result saying what is wrong and the loop goes on; the
counts go to stderr as one line, `tool_agent: {"turns": ..., "tool_calls": ...,
"malformed": ..., "failed": ..., "answered": ...}`, which the rollout runner keeps with the
run. It knows only OPENAI_BASE_URL (the proxy, under the run's session key), OPENAI_API_KEY
(sent as a bearer token) and the model name; ONTHEJOB_TASK, when set, goes as the
X-Onthejob-Task header (the task key the grader finds the task by). Exit 0 whenever the
model was reached, answer or not; 1 if it could not be, or did not answer with a chat
completion (stderr: `tool_agent: the model failed: ...`, saying what it got).

Standard library only, as the demo's calculator agent: a rollout starts it once a run. The
HTTP client and the reading of the question and the environment are learner/harness_client.py.

Run: onthejob rollout --proxy URL --tasks tools-train.jsonl -- \\
         python -m learner.rollout.tool_tasks.agent "{prompt}"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from learner.harness_client import Complete, ModelError, connect, question
from learner.rollout.tool_tasks.tools import FAILED, MALFORMED, TOOLS, run_tool

if TYPE_CHECKING:  # standard library only at run time
    from store.json_types import JsonObject, JsonValue

SUMMARY_PREFIX = "tool_agent: "
TIMEOUT_S = 300  # seconds a model call may take


@dataclass
class Outcome:
    answer: str | None = None  # None: out of turns, the last reply still called tools
    turns: int = 0  # model calls
    tool_calls: int = 0
    malformed: int = 0  # calls that did not fit a tool's definition
    failed: int = 0  # well-formed calls a tool could not answer

    def summary(self) -> str:
        return SUMMARY_PREFIX + json.dumps({**asdict(self), "answered": self.answer is not None})


def solve(
    complete: Complete,
    prompt: str,
    *,
    max_turns: int = 6,
    max_tokens: int = 128,
    temperature: float = 1.0,
    system: str | None = None,
) -> Outcome:
    """Ask, run the tool calls, send the results, until the model answers without calling a
    tool or `max_turns` model calls were made."""
    messages: list[JsonObject] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    outcome = Outcome()
    for turn in range(max_turns):
        message = complete(messages, tools=TOOLS, max_tokens=max_tokens, temperature=temperature)
        outcome.turns += 1
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            content = message.get("content")
            outcome.answer = content if isinstance(content, str) else ""
            return outcome
        messages.append({k: v for k, v in message.items() if v is not None})
        for index, call in enumerate(calls):
            messages.append(run_call(call, f"call_{turn}_{index}", outcome))
    return outcome


def run_call(call: JsonValue, fallback_id: str, outcome: Outcome) -> JsonObject:
    """The tool message answering one of the model's calls, counted in `outcome`."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    name, arguments = function.get("name"), function.get("arguments")
    result = run_tool(
        name if isinstance(name, str) else None,
        arguments if isinstance(arguments, str | dict) else None,
    )
    outcome.tool_calls += 1
    outcome.malformed += result.error == MALFORMED
    outcome.failed += result.error == FAILED
    call_id = call.get("id")
    return {
        "role": "tool",
        "tool_call_id": call_id if isinstance(call_id, str) and call_id else fallback_id,
        "content": result.content,
    }


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line every tool-task harness takes (this one, and frameworks.py's)."""
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-turns", type=int, default=6, help="model calls at most")
    parser.add_argument("--max-tokens", type=int, default=128, help="per model call")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--system", help="a system prompt (none by default)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m learner.rollout.tool_tasks.agent",
        description=(__doc__ or "").splitlines()[0],
    )
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    prompt = question(parser, args.prompt, os.environ)
    complete = connect(parser, args.model, os.environ, timeout_s=TIMEOUT_S)
    try:
        outcome = solve(
            complete,
            prompt,
            max_turns=args.max_turns,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            system=args.system,
        )
    except ModelError as exc:
        print(f"tool_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(outcome.summary(), file=sys.stderr)
    print((outcome.answer or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
