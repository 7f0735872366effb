"""A single-turn question-and-answer agent over plain HTTP: the first stage of the demo's
curriculum (`onthejob demo --curriculum`, learner/demo/curriculum.py).

One question, one model reply, no tool loop (with ``--no-tools``, no tool at all: the
real-model demo's reading questions, `onthejob demo --model smollm2-135m`). The calculator
tool is offered, as the demo model knows it, and the model may answer with it: a reply that
calls the calculator is answered by the value of the expression the model wrote (the
harness evaluates it; the model is neither shown the result nor asked again), any other
reply by its text. So the
reward says whether the model's one reply got the arithmetic right; the calculator agent
(calc_agent.py) adds the second turn, reading the tool's result back and answering with it.

Standard library only, like calc_agent (it is started hundreds of times). Same
environment: OPENAI_BASE_URL, OPENAI_API_KEY, ONTHEJOB_MODEL, ONTHEJOB_TASK.

Run: python -m learner.demo.harnesses.qa_agent "There are 3 boxes with 4 pens in each. ..."
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from learner.demo.harnesses.calc_agent import TIMEOUT_S, run_tool
from learner.demo.tasks import CALCULATOR_TOOL
from learner.harness_client import Complete, ModelError, connect, question

if TYPE_CHECKING:  # standard library only at run time
    from store.json_types import JsonObject


def answer(
    complete: Complete,
    prompt: str,
    *,
    max_tokens: int = 64,
    temperature: float = 1.0,
    tools: bool = True,
) -> str:
    """The model's one reply: its calculator expression's value, else its text."""
    offered = {"tools": [CALCULATOR_TOOL]} if tools else {}
    message: JsonObject = complete(
        [{"role": "user", "content": prompt}],
        **offered,
        max_tokens=max_tokens,
        temperature=temperature,
    )
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if function.get("name") == "calculator":
            return run_tool("calculator", function.get("arguments") or json.dumps({}))
    return str(message.get("content") or "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--no-tools",
        dest="tools",
        action="store_false",
        help="offer no calculator: the reply's text is the answer (the real-model demo)",
    )
    args = parser.parse_args()
    prompt = question(parser, args.prompt, os.environ)
    complete = connect(parser, args.model, os.environ, timeout_s=TIMEOUT_S)
    try:
        reply = answer(
            complete,
            prompt,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            tools=args.tools,
        )
    except ModelError as exc:
        print(f"qa_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(reply.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
