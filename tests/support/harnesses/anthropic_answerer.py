"""A single-turn answerer on the Anthropic SDK (Messages API): the reply on stdout.
Its base URL comes from ANTHROPIC_BASE_URL. Usage: anthropic_answerer.py [PROMPT]"""

from __future__ import annotations

import sys

from anthropic import Anthropic

from tests.support.harnesses.common import extra_body, max_tokens, prompt_from


def main() -> int:
    prompt = prompt_from(sys.argv[1:])
    client = Anthropic(max_retries=0)
    model = client.models.list().data[0].id
    reply = client.messages.create(
        model=model,
        max_tokens=max_tokens(),
        messages=[{"role": "user", "content": prompt}],
        extra_body=extra_body(0),
    )
    print("".join(block.text for block in reply.content if block.type == "text"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
