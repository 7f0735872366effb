"""The judge of the turns the next-turn rules are silent on (`--grader next_turn:judge`).

Given one assistant reply and the message the user sent right after it, an LLM (by default
the served model, through the `judge` grader's endpoint settings) says whether that message
shows the reply was wrong, right, or neither. One call per such turn, a JSON verdict (a
json_schema response format, so vLLM emits valid JSON even from a weak model).

Invariant: `judge` never raises for what the model says: an unreadable or "unclear" verdict
is no signal. A transport failure raises (the grade is tried again later).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from learner.graders.judge import judge_client
from store.next_turn import OpenTurn, TurnSignal, quote

VERDICTS = {"wrong": -1.0, "right": 1.0, "unclear": None}
MAX_CHARS = 2000
SYSTEM = (
    "You read one reply of an AI assistant and the message its user sent right after it. "
    "Decide, from the user's message alone, whether the user found the reply wrong (they "
    "correct it, disagree, or say it failed), right (they accept it, thank the assistant, "
    "or move on satisfied), or whether their message does not say (unclear). Answer with "
    'JSON: {"verdict": "wrong" | "right" | "unclear"}.'
)
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "turn_verdict",
        "schema": {
            "type": "object",
            "properties": {"verdict": {"type": "string", "enum": list(VERDICTS)}},
            "required": ["verdict"],
            "additionalProperties": False,
        },
    },
}


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else "…" + text[-MAX_CHARS:]


class TurnJudge:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,  # None: the model that served the turn
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 32,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.client = judge_client(
            base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )

    def close(self) -> None:
        self.client.close()

    def judge(self, turn: OpenTurn, *, model: str | None) -> TurnSignal | None:
        """The signal the user's next message gives the turn, or None when it says nothing."""
        asked = (
            f"The assistant's reply:\n<<<\n{_clip(turn.reply)}\n>>>\n\n"
            f"The user's next message:\n<<<\n{_clip(turn.next_message)}\n>>>"
        )
        completion = self.client.chat.completions.create(
            model=self.model or model or "default",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": asked}],
            max_tokens=self.max_tokens,
            temperature=0.0,
            response_format=RESPONSE_FORMAT,  # type: ignore[arg-type]  # the documented shape
        )
        text = completion.choices[0].message.content if completion.choices else None
        value = VERDICTS.get(_verdict(text or ""))
        if value is None:
            return None
        return TurnSignal(turn.call_id, turn.turn, value, "judged", quote(turn.next_message))


def _verdict(text: str) -> str | None:
    try:
        found: Any = json.loads(text)
    except ValueError:
        return None
    verdict = found.get("verdict") if isinstance(found, dict) else None
    return verdict if isinstance(verdict, str) else None
