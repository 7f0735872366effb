"""What the test harnesses share: the prompt, the model name, test-only steering, markers.

The random tiny model cannot follow instructions, so tests steer it with vLLM's structured
outputs: ONTHEJOB_HARNESS_FORCE is a JSON list of regexes, the i-th forcing the i-th call's
reply (a missing or null entry leaves that call free). A real deployment sets none of these.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any


def prompt_from(argv: list[str]) -> str:
    """The prompt: the first argument, else stdin, else ONTHEJOB_PROMPT."""
    if argv:
        return argv[0]
    text = sys.stdin.read()
    return text or os.environ.get("ONTHEJOB_PROMPT", "")


def model_name(client: Any) -> str:
    return os.environ.get("ONTHEJOB_HARNESS_MODEL") or client.models.list().data[0].id


def forced_regex(turn: int) -> str | None:
    regexes = json.loads(os.environ.get("ONTHEJOB_HARNESS_FORCE", "[]"))
    return regexes[turn] if turn < len(regexes) else None


def extra_body(turn: int) -> dict[str, Any]:
    regex = forced_regex(turn)
    return {} if regex is None else {"structured_outputs": {"regex": regex}}


def max_tokens() -> int:
    return int(os.environ.get("ONTHEJOB_HARNESS_MAX_TOKENS", "16"))


def hang_if_asked(prompt: str) -> None:
    """Tests of timeouts and Ctrl-C: a prompt containing ONTHEJOB_HARNESS_HANG_ON makes the
    harness announce itself (a file named by its pid in ONTHEJOB_HARNESS_MARKERS) and hang."""
    trigger = os.environ.get("ONTHEJOB_HARNESS_HANG_ON")
    if not trigger or trigger not in prompt:
        return
    markers = Path(os.environ["ONTHEJOB_HARNESS_MARKERS"])
    (markers / str(os.getpid())).write_text(prompt)
    while True:
        signal.pause()
