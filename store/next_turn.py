"""Next-turn signals: how an assistant turn did, read off what came right after it.

The traffic carries most of what a person would judge a turn by, in the turn that follows:
the tool result its call produced, the user's next message. Only the rules that are certain
are here (pure functions over a conversation, store/conversation.py):

- **tool_error**: a tool result of the turn's calls is an error: flagged by the harness
  (Messages' `is_error`), a Python traceback, a non-zero exit code, `command not found`,
  or a result that starts with `Error:`;
- **interrupted**: the user stopped the turn (Claude Code records "[Request interrupted by
  user]");
- **retried**: the user's next message repeats the one the turn answered, word for word.

Each signal is -1 (the turn did badly), names its rule and quotes its evidence. A turn the
rules say nothing about is left to the self-judge, with what came next in view.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from store.conversation import Message

EVIDENCE_CHARS = 240
_TOOL_ERRORS = (
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"\bexit(?:ed with)? code:? *-?[1-9]\d*\b", re.IGNORECASE),
    re.compile(r"\bexit status -?[1-9]\d*\b", re.IGNORECASE),
    re.compile(r"command not found"),
    re.compile(r"\A\s*Error:"),
)
_INTERRUPTED = re.compile(r"\[Request interrupted by user")


@dataclass(frozen=True)
class TurnSignal:
    call_id: str  # the call whose reply the signal judges
    turn: int  # index of that reply in the conversation
    value: float  # -1.0: the turn did badly
    rule: str  # tool_error | interrupted | retried
    evidence: str  # what came next that says so, shortened

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 1] + "…"


def tool_failed(message: Message) -> bool:
    if message.get("is_error"):
        return True
    return any(p.search(message["text"]) for p in _TOOL_ERRORS)


def _same_request(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def next_turn_signals(messages: list[Message]) -> list[TurnSignal]:
    """The certain signals for each assistant turn of a conversation, in order."""
    signals: list[TurnSignal] = []
    asked: str | None = None  # the user message the current turn answers
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "context":
            asked = None
            continue
        if role == "user":
            asked = message["text"]
            continue
        if role != "assistant" or message.get("call_id") is None:
            continue
        signal = _judge(messages, i, asked)
        if signal is not None:
            signals.append(signal)
    return signals


def _judge(messages: list[Message], i: int, asked: str | None) -> TurnSignal | None:
    """What follows turn i up to the next assistant turn (tool results and the user's
    words, in whatever order the API put them) judges it."""
    turn = messages[i]
    ids = {call.get("id") for call in turn["tool_calls"]}
    following: list[Message] = []
    for after in messages[i + 1 :]:
        if after["role"] in ("assistant", "context"):
            break
        following.append(after)

    def signal(rule: str, evidence: str) -> TurnSignal:
        return TurnSignal(turn["call_id"], i, -1.0, rule, _quote(evidence))

    # an interruption first: Claude Code also sends it as a tool result flagged as an error
    for after in following:
        if after["role"] in ("user", "tool") and _INTERRUPTED.search(after["text"]):
            return signal("interrupted", after["text"])
    for after in following:
        mine = after["tool_call_id"] in ids or after["tool_call_id"] is None
        if after["role"] == "tool" and mine and tool_failed(after):
            return signal("tool_error", after["text"] or "(flagged as an error)")
    users = [m for m in following if m["role"] == "user"]
    if users and asked is not None and asked.strip() and _same_request(users[0]["text"], asked):
        return signal("retried", users[0]["text"])
    return None
