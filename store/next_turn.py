"""Next-turn signals: how an assistant turn did, read off what came right after it.

The traffic carries most of what a person would judge a turn by, in the turn that follows:
the tool result its call produced, the user's next message. Only the rules that are certain
are here (pure functions over a conversation, store/conversation.py):

- **tool_error**: a tool result of the turn's calls is an error: flagged by the harness
  (Messages' `is_error`, or a result that is only `{"error": ...}`, pydantic-ai's flag on
  chat completions), a Python traceback, a non-zero exit code, `command not found`, or a
  result that starts with `Error:`;
- **interrupted**: the user stopped the turn (Claude Code records "[Request interrupted by
  user]");
- **retried**: the user's next message repeats the one the turn answered, word for word;
- **corrected**: the user's next message opens by saying the turn was wrong ("No, that's
  wrong", "Incorrect.", "That's not right, it's 42");
- **approved**: the user's next message opens by saying it was right ("Thanks!", "That's
  correct", "Perfect") and says nothing of it being wrong.

Each signal is -1 (the turn did badly) or +1 (approved), names its rule and quotes its
evidence. A retry, a correction or an approval judges the agent's whole turn: every reply
since the user's previous message (its tool calls led to the answer), each one not judged
by a signal of its own. The word rules read only how the next message opens: "No problem",
"Thanks, but that's wrong" or "Are you sure? I get 42" are not certain, and are left to the
judge with what came next in view (learner/graders/next_turn.py), as is every turn the
rules are silent on.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import TypedDict, cast

import orjson

from store.conversation import Message

EVIDENCE_CHARS = 240
_TOOL_ERRORS = (
    re.compile(r"Traceback \(most recent call last\)"),
    re.compile(r"\bexit(?:ed with)? code:? *-?[1-9]\d*\b", re.IGNORECASE),
    re.compile(r"\bexit status -?[1-9]\d*\b", re.IGNORECASE),
    re.compile(r"command not found"),
    re.compile(r"\A\s*Error:"),
)
# the user's verdict on the agent's turn: it judges every reply of that turn
USER_VERDICTS = frozenset({"retried", "corrected", "approved"})
_INTERRUPTED = re.compile(r"\[Request interrupted by user")
# how a message opens when the user says the answer was wrong ("no" only with a break after
# it or "that/it" next: "no problem" and "no thanks" are not corrections)
_CORRECTED = re.compile(
    r"\A\W*(?:no\s*[,.!;:\u2014]\s*(?!\s|thanks?\b|thank you|problem|worries|need|just|please"
    r"|rush|hurry|later|not now)|no,?\s+(?:that|this|it)\b|nope\b|wrong\b|incorrect\b"
    r"|not (?:quite|right|correct)\b(?!\s+now)"
    r"|(?:that|this|it)(?:'s|\u2019s| is| was) (?:wrong|incorrect|not (?:right|correct|it))\b"
    r"|you(?:'re|\u2019re| are) wrong\b)",
    re.IGNORECASE,
)
# ... and when they say it was right
_APPROVED = re.compile(
    r"\A\W*(?:thanks\b|thank you\b|thx\b|correct\b|exactly\b|perfect\b"
    r"|(?:yes,?\s+)?(?:that's|that\u2019s|that is|it's|it is) (?:right|correct)\b)",
    re.IGNORECASE,
)
# anywhere in an approving message, these make it uncertain ("thanks, but that's wrong")
_DOUBT = re.compile(
    r"\b(?:wrong|incorrect|not|but|however|error|fail\w*|broke\w*)\b|n't\b|n\u2019t\b", re.I
)


class TurnSignalFields(TypedDict):
    """A TurnSignal as a dict (the admin API's view of a trajectory)."""

    call_id: str
    turn: int
    value: float
    rule: str
    evidence: str


@dataclass(frozen=True)
class TurnSignal:
    call_id: str  # the call whose reply the signal judges
    turn: int  # index of that reply in the conversation
    value: float  # -1.0: the turn did badly; +1.0: the user said it did well
    rule: str  # tool_error | interrupted | retried | corrected | approved
    evidence: str  # what came next that says so, shortened

    def as_dict(self) -> TurnSignalFields:
        return cast(TurnSignalFields, asdict(self))


def quote(text: str) -> str:
    """Evidence as stored: whitespace folded, at most EVIDENCE_CHARS."""
    text = " ".join(text.split())
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 1] + "…"


def tool_failed(message: Message) -> bool:
    if message.get("is_error"):
        return True
    text = message["text"]
    return any(p.search(text) for p in _TOOL_ERRORS) or _error_object(text)


def _error_object(text: str) -> bool:
    """A result that is a JSON object holding only a non-empty `error`: how pydantic-ai
    sends a failed or turned-down call's result on an API without an error flag (chat
    completions), e.g. `{"error": [{"type": "json_invalid", ...}]}`."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return False
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and list(parsed) == ["error"] and bool(parsed["error"])


def user_verdict(text: str) -> float | None:
    """-1 when a user's message opens by saying the answer before it was wrong, +1 when it
    opens by saying it was right (and doubts nothing), None when it is not that certain."""
    if _CORRECTED.search(text):
        return -1.0
    if _APPROVED.search(text) and not _DOUBT.search(text):
        return 1.0
    return None


def _same_request(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def next_turn_signals(messages: list[Message]) -> list[TurnSignal]:
    """The certain signals for each assistant turn of a conversation, in order.

    What the user says judges the agent's whole turn, not only its last reply: every reply
    since the user's previous message (the tool calls that led to the answer, and the
    answer) gets the user's verdict, unless a signal of its own (a failed tool call)
    already judged it.
    """
    by_turn: dict[int, TurnSignal] = {}
    asked: str | None = None  # the user message the current turn answers
    since_asked: list[int] = []  # the replies of the agent's turn so far
    for i, message in enumerate(messages):
        role = message["role"]
        if role in ("context", "user"):
            asked = message["text"] if role == "user" else None
            since_asked = []
            continue
        if role != "assistant" or message.get("call_id") is None:
            continue
        since_asked.append(i)
        signal = _judge(messages, i, asked)
        if signal is None:
            continue
        by_turn[i] = signal
        if signal.rule in USER_VERDICTS:
            for earlier in since_asked[:-1]:
                if earlier not in by_turn:
                    call_id = messages[earlier]["call_id"]
                    assert call_id is not None
                    by_turn[earlier] = replace(signal, call_id=call_id, turn=earlier)
    return [by_turn[i] for i in sorted(by_turn)]


def _following(messages: list[Message], i: int) -> list[Message]:
    """What came after reply i, up to the next reply: tool results and the user's words."""
    following: list[Message] = []
    for after in messages[i + 1 :]:
        if after["role"] in ("assistant", "context"):
            break
        following.append(after)
    return following


def _judge(messages: list[Message], i: int, asked: str | None) -> TurnSignal | None:
    """What follows turn i up to the next assistant turn (tool results and the user's
    words, in whatever order the API put them) judges it."""
    turn = messages[i]
    ids = {call.get("id") for call in turn["tool_calls"]}
    following = _following(messages, i)

    def signal(rule: str, evidence: str, value: float = -1.0) -> TurnSignal:
        return TurnSignal(turn["call_id"], i, value, rule, quote(evidence))

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
    if users:
        verdict = user_verdict(users[0]["text"])
        if verdict is not None:
            rule = "corrected" if verdict < 0 else "approved"
            return signal(rule, users[0]["text"], verdict)
    return None


@dataclass(frozen=True)
class OpenTurn:
    """A reply the rules are silent on that the user answered: the judge's question."""

    call_id: str
    turn: int
    reply: str  # the reply's text and tool calls, as the user saw them
    next_message: str  # what the user said next


def open_turns(messages: list[Message], signals: list[TurnSignal]) -> list[OpenTurn]:
    """The replies no certain signal judged that a user message follows (before the next
    reply): what a judge, with that message in view, may still judge."""
    judged = {s.turn for s in signals}
    found: list[OpenTurn] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or message.get("call_id") is None or i in judged:
            continue
        for after in _following(messages, i):
            if after["role"] == "user" and after["text"].strip():
                calls = " ".join(
                    f"[calls {c.get('name')}({c.get('arguments')})]" for c in message["tool_calls"]
                )
                reply = " ".join(p for p in (message["text"], calls) if p)
                found.append(OpenTurn(message["call_id"], i, reply, after["text"]))
                break
    return found
