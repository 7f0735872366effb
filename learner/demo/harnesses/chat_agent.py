"""A small multi-turn agent written against the openai SDK, as a user's harness would be.

It only knows OPENAI_BASE_URL (pointed at the proxy) and the model name; it keeps the
whole conversation and sends it back each turn. Run: python -m learner.demo.harnesses.chat_agent
"""

from __future__ import annotations

import argparse
import os
import sys

import openai

QUESTIONS = [
    "What is 12 plus 30?",
    "Now multiply that by 2.",
    "Give the result in words.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("ONTHEJOB_MODEL", "default"))
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    api = openai.OpenAI(api_key=os.environ.get("OPENAI_API_KEY", "not-needed"))
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a calculator."}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        reply = api.chat.completions.create(
            model=args.model,
            messages=messages,
            max_tokens=args.max_tokens,  # type: ignore[arg-type]
        )
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        print(f"user: {question}\nagent: {answer!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
