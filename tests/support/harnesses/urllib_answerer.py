"""A single-turn answerer on the standard library only (starts in milliseconds, so learning
tests can afford hundreds of runs): one chat completion, the reply on stdout.

Usage: urllib_answerer.py [--write FILE]   (the prompt from stdin, else ONTHEJOB_PROMPT)

ONTHEJOB_HARNESS_TYPE, when set, goes out as X-Onthejob-Type: a harness that can send
headers names its interaction type.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'x')}",
            **(
                {"x-onthejob-type": os.environ["ONTHEJOB_HARNESS_TYPE"]}
                if os.environ.get("ONTHEJOB_HARNESS_TYPE")
                else {}
            ),
        },
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main() -> int:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    prompt = sys.stdin.read() or os.environ.get("ONTHEJOB_PROMPT", "")
    with urllib.request.urlopen(base + "/models", timeout=30) as response:
        model = (
            os.environ.get("ONTHEJOB_HARNESS_MODEL") or json.loads(response.read())["data"][0]["id"]
        )
    reply = post(
        base + "/chat/completions",
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": int(os.environ.get("ONTHEJOB_HARNESS_MAX_TOKENS", "16")),
            "temperature": float(os.environ.get("ONTHEJOB_HARNESS_TEMPERATURE", "1.0")),
        },
    )
    answer = reply["choices"][0]["message"]["content"] or ""  # type: ignore[index]
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        Path(sys.argv[2]).write_text(answer)
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
