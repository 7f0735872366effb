"""What the LLM judge is shown and how its verdict is read back.

Pure functions, no I/O. Candidates are labelled A, B, C...; the judge answers with one JSON
object {"reasoning": str, "scores": {label: 0-10}}, which becomes rewards in [0, 1].
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from typing import Any

from store.json_types import JsonObject

DEFAULT_RUBRIC = (
    "Score each candidate from 0 (wrong, unhelpful or unsafe) to 10 (correct, complete and "
    "clear). Correctness matters most, then completeness, then clarity; length by itself is "
    "worth nothing. Compare the candidates with each other: a better answer gets a higher "
    "score, equally good answers get equal scores."
)
MAX_SCORE = 10.0
_CUT = "[...earlier text cut...]\n"


class JudgeOutputError(ValueError):
    """The judge's reply holds no usable verdict."""


@dataclass(frozen=True)
class Verdict:
    scores: dict[str, float]  # label -> score in [0, MAX_SCORE]
    reasoning: str


def labels(count: int) -> list[str]:
    """A, B, ..., Z, AA, AB, ...: short names the judge can refer to."""
    letters = string.ascii_uppercase
    out = []
    for index in range(count):
        label = ""
        index += 1
        while index:
            index, rest = divmod(index - 1, 26)
            label = letters[rest] + label
        out.append(label)
    return out


def build_messages(
    prompt: str | None, answers: list[str], *, rubric: str, max_answer_chars: int
) -> list[dict[str, str]]:
    names = labels(len(answers))
    shape = json.dumps({"reasoning": "...", "scores": dict.fromkeys(names, "0-10")})
    system = (
        "You are a strict and fair judge. Rate the candidate answers to the task below.\n\n"
        f"Rubric:\n{rubric}\n\n"
        f"Reply with one JSON object and nothing else, shaped like {shape}: first a short "
        "comparison of the candidates, then an integer score for every candidate."
    )
    parts = [f"Task:\n{prompt or '(the task text is not available; judge the answers alone)'}"]
    for name, answer in zip(names, answers, strict=True):
        parts.append(f"Candidate {name}:\n<<<\n{_clip(answer, max_answer_chars)}\n>>>")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def response_format(names: list[str], *, max_reasoning_chars: int) -> JsonObject:
    """A json_schema response format: servers with structured outputs (vLLM) then emit valid
    JSON even from a weak model. Reasoning comes first so the scores can follow from it."""
    score = {"type": "integer", "minimum": 0, "maximum": int(MAX_SCORE)}
    schema = {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": max_reasoning_chars},
            "scores": {
                "type": "object",
                "properties": dict.fromkeys(names, score),
                "required": names,
                "additionalProperties": False,
            },
        },
        "required": ["reasoning", "scores"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}


def parse_verdict(text: str, names: list[str]) -> Verdict:
    """The first JSON object in `text` that has "scores" (prose or code fences around it are
    tolerated); every label must be scored; scores are clamped to [0, MAX_SCORE]."""
    found = _first_object_with(text, "scores")
    raw = found["scores"]
    if not isinstance(raw, dict):
        raise JudgeOutputError(f'"scores" is not an object: {raw!r:.200}')
    by_label = {str(key).strip().upper(): value for key, value in raw.items()}
    missing = [name for name in names if name not in by_label]
    if missing:
        raise JudgeOutputError(f"no score for candidate(s) {', '.join(missing)}")
    scores = {name: _score(name, by_label[name]) for name in names}
    reasoning = found.get("reasoning", "")
    return Verdict(scores, reasoning if isinstance(reasoning, str) else json.dumps(reasoning))


def _first_object_with(text: str, key: str) -> JsonObject:
    # strict=False: weak models put raw control characters inside strings; keep the verdict.
    decoder = json.JSONDecoder(strict=False)
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and key in value:
            return value
        start = text.find("{", start + 1)
    raise JudgeOutputError(f"no JSON object with {key!r} in the reply: {text[:300]!r}")


def _score(name: str, value: Any) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        score = float(value)
    except (TypeError, ValueError):
        raise JudgeOutputError(f"score of {name} is not a number: {value!r:.100}") from None
    if not math.isfinite(score):
        raise JudgeOutputError(f"score of {name} is not finite: {value!r}")
    return min(max(score, 0.0), MAX_SCORE)


def _clip(answer: str, limit: int) -> str:
    # Keep the end: that is where a final answer usually is.
    return answer if len(answer) <= limit else _CUT + answer[-limit:]
