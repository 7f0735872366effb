"""Which arm of a canary a call is in: a pure function of the canary, the call's assignment
key and the candidate's share, so every call of a session gets the same arm, in every proxy
and after a restart, and the sessions split at random in the proportion asked.

The key (`assignment_key`) is the session (`s:<session key>`) where the call names one, else
the opening of its conversation: its messages up to and including the first user message
(the system prompt and the first question), which every later call of an implicit
trajectory repeats. So the assignment is per trajectory; trajectories that open alike share
an arm. A text completion's opening is its prompt. A call with no opening to read (no user
message) is assigned on its own.

Salted by the canary's id: a session in one canary's candidate arm is in the next canary's
at random again, so no session is every canary's guinea pig.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from proxy.base.capture import CHAT

_SCALE = float(2**64)


def in_candidate_arm(canary_id: int, key: str, share: float) -> bool:
    """Whether the call with this assignment key goes to the canary's candidate."""
    digest = hashlib.blake2b(f"{canary_id}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE < share


def assignment_key(session: str | None, api: str, body: dict[str, Any]) -> str | None:
    """The call's session, else its conversation's opening; None: neither."""
    if session is not None:
        return "s:" + session
    opening = _opening(body.get("messages")) if api == CHAT else body.get("prompt")
    if opening is None:
        return None
    try:
        return "m:" + hashlib.blake2b(orjson.dumps(opening), digest_size=12).hexdigest()
    except TypeError:  # not JSON (cannot come from a parsed body; kept safe)
        return None


def _opening(messages: Any) -> list[Any] | None:
    """The messages up to and including the first user message."""
    if not isinstance(messages, list):
        return None
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: index + 1]
    return None
