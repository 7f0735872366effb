"""A one-reply agent over plain HTTP: the question goes to the model, its reply is the
answer (the real-model demo, `onthejob demo --model smollm2-135m`).

No system prompt of its own (the model's chat template brings its default), no tools, no
second turn: what is graded is the model's one reply. Standard library only, like
calc_agent (it is started hundreds of times). Environment: OPENAI_BASE_URL,
OPENAI_API_KEY, ONTHEJOB_MODEL, ONTHEJOB_TASK.

Run: python -m learner.demo.harnesses.answer_agent "Which city did Anna fly to? ..."
"""

from __future__ import annotations

import argparse
import os
import sys

from learner.demo.harnesses.calc_agent import ModelError, http_chat, question


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", help="the question (else $ONTHEJOB_PROMPT or stdin)")
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()
    prompt = question(args).strip()
    if not prompt:
        parser.error("no question given (argument, ONTHEJOB_PROMPT or stdin)")
    base_url = os.environ.get("OPENAI_BASE_URL")
    if not base_url:
        parser.error("OPENAI_BASE_URL is not set (the proxy's URL, e.g. http://127.0.0.1:8080/v1)")
    task = os.environ.get("ONTHEJOB_TASK")
    complete = http_chat(
        base_url,
        args.model,
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        headers={"X-Onthejob-Task": task} if task else None,
    )
    try:
        reply = complete(
            [{"role": "user", "content": prompt}],
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    except ModelError as exc:
        print(f"answer_agent: the model failed: {exc}", file=sys.stderr)
        return 1
    print(str(reply.get("content") or "").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
