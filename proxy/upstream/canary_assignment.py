"""Which arm of a canary a call is in: a pure function of the canary, the call's assignment
key and the candidate's share, so every call of a session gets the same arm, in every proxy
and after a restart, and the sessions split at random in the proportion asked.

The key is the call's conversation key (proxy/base/requests.py): its session where it names
one, else its conversation's opening, which every later call of an implicit trajectory
repeats. So the assignment is per trajectory; trajectories that open alike share an arm. A
call with no opening to read (no user message) is assigned on its own.

Salted by the canary's id: a session in one canary's candidate arm is in the next canary's
at random again, so no session is every canary's guinea pig.
"""

from __future__ import annotations

import hashlib

_SCALE = float(2**64)


def in_candidate_arm(canary_id: int, key: str, share: float) -> bool:
    """Whether the call with this assignment key goes to the canary's candidate."""
    digest = hashlib.blake2b(f"{canary_id}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE < share
