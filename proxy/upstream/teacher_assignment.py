"""Which calls a teacher answers (`serve --teacher-url`): a pure function of the call's
client key name and its conversation key, so every call of one conversation goes to the
same side, in every proxy and after a restart.

A key listed in `--teacher-key` sends all its calls to the teacher. Of the rest, the share
`--teacher-share` goes by the conversation key (proxy/base/requests.py `conversation_key`:
the session, else the conversation's opening, which every later call repeats); a call with
no conversation key is assigned by its own id. Salted apart from the canaries' assignment
(proxy/upstream/canary_assignment.py), so the two splits are independent.
"""

from __future__ import annotations

import hashlib

_SCALE = float(2**64)


def teacher_answers(
    key_name: str | None, conversation: str, *, keys: frozenset[str], share: float
) -> bool:
    """Whether the teacher answers the call of this client key and conversation."""
    if key_name is not None and key_name in keys:
        return True
    if share <= 0.0:
        return False
    if share >= 1.0:
        return True
    digest = hashlib.blake2b(f"teacher\x00{conversation}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE < share
