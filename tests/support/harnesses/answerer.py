"""A single-turn answerer: one chat completion through the OpenAI SDK, the reply on stdout.

Usage: answerer.py [PROMPT] [--write FILE]   (without PROMPT: stdin, else ONTHEJOB_PROMPT)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openai import OpenAI

from tests.support.harnesses.common import (
    extra_body,
    hang_if_asked,
    max_tokens,
    model_name,
    prompt_from,
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("prompt", nargs="*")
    parser.add_argument("--write", type=Path, help="also write the answer to this file")
    args = parser.parse_args()
    prompt = prompt_from(args.prompt)
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the runner
    reply = client.chat.completions.create(
        model=model_name(client),
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens(),
        extra_body=extra_body(0),
    )
    answer = reply.choices[0].message.content or ""
    hang_if_asked(prompt)
    if args.write:
        args.write.write_text(answer)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
