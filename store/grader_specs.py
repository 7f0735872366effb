"""The grader SPEC format (`KIND[:ARG][@WEIGHT]`), as `--grader` flags and a task file's
`grader` field write it. Only its syntax lives here; learner/graders/combine.py builds the
graders from it.
"""

from __future__ import annotations

import math
import re

# Cheap and possibly-pending graders run first: a trajectory that is already pending or
# failed is not sent to the slow ones (commands, the judge) at all.
ORDER = {"feedback": 0, "reference": 1, "next_turn": 2, "python": 3, "command": 4, "judge": 5}
FORMS = (
    "reference, next_turn[:judge], python:MODULE:FUNCTION, command:SHELL_COMMAND, "
    "judge[:BASE_URL], "
    "feedback"
)
# Only a trailing @<number> is a weight: commands and URLs may contain '@' and ':' themselves.
_WEIGHT = re.compile(r"@([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_spec(spec: str) -> tuple[str, str | None, float]:
    """'KIND[:ARG][@WEIGHT]' -> (kind, arg or None, weight); ValueError saying what is wrong."""
    body, weight = _split_weight(spec.strip())
    kind, colon, arg = body.partition(":")
    kind = kind.strip()
    if kind not in ORDER:
        hint = " (a weight is @ followed by a number)" if "@" in kind else ""
        raise ValueError(f"grader spec {spec!r}: unknown kind {kind!r}{hint}; expected {FORMS}")
    if kind in ("reference", "feedback") and colon:
        raise ValueError(f"grader spec {spec!r}: {kind} takes no argument")
    if kind == "next_turn" and colon and arg.strip() != "judge":
        raise ValueError(f"grader spec {spec!r}: expected next_turn or next_turn:judge")
    if kind == "python" and not re.fullmatch(r"[\w.]+:[\w.]+", arg.strip()):
        raise ValueError(f"grader spec {spec!r}: expected python:MODULE:FUNCTION")
    if kind == "command" and not arg.strip():
        raise ValueError(f"grader spec {spec!r}: expected command:SHELL_COMMAND")
    if kind == "judge" and colon and not re.match(r"https?://\S+$", arg.strip()):
        raise ValueError(f"grader spec {spec!r}: expected judge or judge:http(s)://HOST[:PORT]/v1")
    return kind, arg.strip() or None, weight


def _split_weight(spec: str) -> tuple[str, float]:
    found = _WEIGHT.search(spec)
    if found is None:
        return spec, 1.0
    weight = float(found.group(1))
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"grader spec {spec!r}: the weight must be a positive number")
    return spec[: found.start()], weight
