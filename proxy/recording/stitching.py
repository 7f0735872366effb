"""Which trajectory a call belongs to.

Rule: calls with the same session key form one trajectory. Without a key, a call whose
messages equal an earlier call's messages plus that call's reply (plus new messages)
continues the earlier call's trajectory; anything else starts a new one. A continuation
point is consumed once, so identical parallel runs (same prompt, same reply) each keep
their own trajectory. A trajectory idle for `idle_timeout` seconds is finished.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.base.capture import ReplyMessage
from store.json_types import JsonObject
from store.tool_arguments import canonical_arguments

_ID_PREFIX = os.urandom(8).hex()
_id_counter = itertools.count(int.from_bytes(os.urandom(4), "big"))


def new_id() -> str:
    """A unique 32-hex-digit id: a random per-process prefix and a counter.

    Unique across processes and restarts (64 random bits), and no syscall per call,
    which uuid4/os.urandom cost on the hot path.
    """
    return f"{_ID_PREFIX}{next(_id_counter) & 0xFFFFFFFFFFFFFFFF:016x}"


def _text_of(content: Any) -> str:
    """Content as plain text: strings stay, lists of text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text", "")) if part.get("type") == "text" else "")
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def normalise_message(message: Any) -> Any:
    """The parts of a message that identify it, independent of how a client echoes it back.

    Clients re-send the assistant reply with small differences (content None vs "", extra
    keys, tool-call ids, arguments re-serialised: store/tool_arguments.py); role, text, tool
    name/arguments and tool_call_id are what count.
    """
    if not isinstance(message, dict):
        return message
    normal: JsonObject = {
        "role": message.get("role"),
        "content": _text_of(message.get("content")),
    }
    tool_calls = message.get("tool_calls")
    if tool_calls:
        normal["tool_calls"] = [
            [
                (call.get("function") or {}).get("name"),
                canonical_arguments((call.get("function") or {}).get("arguments")),
            ]
            for call in tool_calls
            if isinstance(call, dict)
        ]
    if message.get("tool_call_id"):
        normal["tool_call_id"] = message["tool_call_id"]
    return normal


class PrefixHasher:
    """Running hash over a message list: digest after each prefix, in O(total size)."""

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, message: Any) -> str:
        self._hash.update(orjson.dumps(normalise_message(message), option=orjson.OPT_SORT_KEYS))
        self._hash.update(b"\x1e")
        return self._hash.copy().hexdigest()


def prefix_hashes(messages: list[Any]) -> list[str]:
    """hashes[i] identifies messages[: i + 1]."""
    hasher = PrefixHasher()
    return [hasher.add(m) for m in messages]


def continuation_hash(messages: list[Any], reply: ReplyMessage | None) -> str | None:
    """Hash of the conversation as a continuing call would send it back: messages + reply."""
    if reply is None:
        return None
    hasher = PrefixHasher()
    for message in messages:
        hasher.add(message)
    return hasher.add(reply)


def derive_task_key(messages: list[Any] | None) -> str | None:
    """The implicit task key: the first user message, normalised (case, whitespace)."""
    for message in messages or []:
        if isinstance(message, dict) and message.get("role") == "user":
            text = " ".join(_text_of(message.get("content")).lower().split())
            if len(text) <= 200:
                return "msg:" + text
            digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
            return f"msg:{text[:180]}~{digest}"
    return None


@dataclass(slots=True)  # one object per open trajectory, no __dict__: less memory and GC work
class TrajectoryState:
    id: str
    session_key: str | None
    started_at: float
    last_call_at: float
    task_key: str | None = None
    group_key: str | None = None  # fan-out: the GRPO group its first call was sampled in
    interaction_type: str | None = None  # fixed by its first call (proxy/recording/interaction.py)
    last_call_id: str | None = None
    # prompt + first completion of the last call: the base the next prompt is stored against
    # (empty once shed for memory: the next prompt is then stored whole)
    last_sequence: Sequence[int] = field(default_factory=lambda: array("q"))
    # its last call ended with an answer, no tool call pending: `answered_timeout` finishes it
    answered: bool = False


def token_array(*parts: Sequence[int]) -> array[int] | None:
    """Token ids as a flat array, or None if they are not 64-bit integers.

    What the tracker keeps is an array, never a list: the garbage collector walks a list
    of ints id by id (up to `max_tokens` of them) at every collection that reaches it --
    60-70 ms pauses under load -- and the list costs 36 bytes a token, not 8.
    """
    out = array("q")
    try:
        for part in parts:
            out.extend(part)
    except (TypeError, OverflowError):
        return None
    return out


_PRUNE_FROM = 64


class TrajectoryTracker:
    """In-memory map of open trajectories; the recorder is its only user (one thread).

    Bounded whatever the traffic: at most `max_open` trajectories (the least recently
    active are finished first), as many waiting continuation points, and `max_tokens`
    tokens of last sequences (the least recently active shed theirs first).
    """

    def __init__(
        self,
        idle_timeout: float,
        max_open: int = 100_000,
        max_tokens: int = 4_000_000,
        answered_timeout: float | None = None,
    ) -> None:
        self.idle_timeout = idle_timeout
        # a trajectory whose last call answered (no tool call pending) is finished sooner:
        # its harness runs no tool, only a person's next message can continue it
        self.answered_timeout = min(
            idle_timeout, idle_timeout if answered_timeout is None else answered_timeout
        )
        self.max_open = max_open
        self.max_tokens = max_tokens
        self._by_session: dict[str, TrajectoryState] = {}
        # in order of last activity, least recent first
        self._by_id: OrderedDict[str, TrajectoryState] = OrderedDict()
        # continuation hash -> trajectory ids waiting to be continued, oldest first; ids of
        # trajectories finished since are skipped when taken, and the oldest hashes dropped
        self._continuations: OrderedDict[str, list[str]] = OrderedDict()
        # a digest's list is pruned of finished ids once it passes this length (then twice
        # what was left): identical conversations (one prompt, one reply, sent again and
        # again) offer the same digest for ever, and nobody takes from it
        self._prune_at: dict[str, int] = {}
        # trajectories holding a last sequence, least recently touched first
        self._holding: OrderedDict[str, TrajectoryState] = OrderedDict()
        # answered trajectories, least recently active first: they expire on their own clock
        self._answered: OrderedDict[str, TrajectoryState] = OrderedDict()
        self.tokens = 0
        self.taken: str | None = None
        self.evicted = 0  # forgotten for the cap while not idle (left open in the database)

    def __len__(self) -> int:
        return len(self._by_id)

    def knows_session(self, session_key: str) -> bool:
        return session_key in self._by_session

    def resolve(
        self,
        *,
        session_key: str | None,
        messages: list[Any] | None,
        now: float,
        find_open: Callable[[str], tuple[str, float, float] | None] | None = None,
        hashes: list[str] | None = None,
    ) -> tuple[TrajectoryState, bool]:
        """The trajectory this call belongs to, and whether it is new.

        `find_open(session_key)` looks up a session's open trajectory (id, started_at,
        last_call_at) that this process does not know, e.g. after a restart. The
        continuation point a call took is left in `taken` (see `give_back`). `hashes`:
        the messages' `prefix_hashes`, when the caller has them already.
        """
        self.taken: str | None = None
        if session_key is not None:
            state = self._by_session.get(session_key)
            if state is None and find_open is not None:
                found = find_open(session_key)
                if found is not None:
                    state = TrajectoryState(found[0], session_key, found[1], found[2])
                    self._by_id[state.id] = state
                    self._by_session[session_key] = state
            if state is not None and self._alive(state, now):
                return state, False
            state = self._open(session_key, now)
            self._by_session[session_key] = state
            return state, True
        if messages:
            for digest in reversed(hashes if hashes is not None else prefix_hashes(messages)):
                state = self._take_continuation(digest, now)
                if state is not None:
                    self.taken = digest
                    return state, False
        return self._open(None, now), True

    def give_back(self, digest: str, state: TrajectoryState) -> None:
        """Return a continuation point a failed call took: its retry must find it."""
        self._continuations.setdefault(digest, []).insert(0, state.id)

    def offer_continuation(self, digest: str | None, state: TrajectoryState) -> None:
        """Let a later call that sends back `digest`'s conversation continue `state`."""
        if digest is None or state.session_key is not None:
            return
        waiting = self._continuations.get(digest)
        if waiting is not None:
            waiting.append(state.id)
            if len(waiting) > self._prune_at.get(digest, _PRUNE_FROM):
                alive = self._by_id
                waiting[:] = [i for i in waiting if i in alive]
                self._prune_at[digest] = max(_PRUNE_FROM, 2 * len(waiting))
            return
        self._continuations[digest] = [state.id]
        if len(self._continuations) > self.max_open:
            oldest, _ = self._continuations.popitem(last=False)
            self._prune_at.pop(oldest, None)

    def touch(
        self,
        state: TrajectoryState,
        ended: float,
        call_id: str,
        sequence: Sequence[int],
        answered: bool = False,
    ) -> None:
        """A call of `state` ended at `ended`: idle time counts from the end of a call, so a
        long call and the tool time after it do not split a session. `answered`: it ended
        with an answer, no tool call pending (`answered_timeout` applies)."""
        state.last_call_at = max(state.last_call_at, ended)
        state.last_call_id = call_id
        state.answered = answered
        self._answered.pop(state.id, None)
        if answered:
            self._answered[state.id] = state
        self.tokens += len(sequence) - len(state.last_sequence)
        state.last_sequence = sequence
        self._by_id.move_to_end(state.id)
        self._holding.pop(state.id, None)
        if sequence:
            self._holding[state.id] = state
        while self.tokens > self.max_tokens and self._holding:
            _, shed = self._holding.popitem(last=False)
            self.tokens -= len(shed.last_sequence)
            shed.last_sequence = array("q")

    def expire(self, now: float) -> list[TrajectoryState]:
        """Forget trajectories idle past the timeout, and the least recently active past
        the cap; return the idle ones (the caller finishes them).

        Those forgotten for the cap are not idle yet: they stay open in the database and
        finish there once they are (`repo.finish_idle`), and a session's next call finds
        its trajectory there again. Finishing them here cost one row update per call, in
        the proxy's process, at any rate of new trajectories past the cap (issue 16).
        """
        idle: list[TrajectoryState] = []
        while self._answered:  # on the shorter clock: not always at the front of _by_id
            state = next(iter(self._answered.values()))
            if self._alive(state, now):
                break
            self._forget(state)
            idle.append(state)
        while self._by_id:
            state = next(iter(self._by_id.values()))
            alive = self._alive(state, now)
            if alive and len(self._by_id) <= self.max_open:
                break
            self._forget(state)
            if alive:
                self.evicted += 1
            else:
                idle.append(state)
        return idle

    def _forget(self, state: TrajectoryState) -> None:
        self._by_id.pop(state.id, None)
        self._answered.pop(state.id, None)
        if state.session_key is not None and self._by_session.get(state.session_key) is state:
            del self._by_session[state.session_key]
        if self._holding.pop(state.id, None) is not None:
            self.tokens -= len(state.last_sequence)

    def get(self, trajectory_id: str) -> TrajectoryState | None:
        return self._by_id.get(trajectory_id)

    def _alive(self, state: TrajectoryState, now: float) -> bool:
        timeout = self.answered_timeout if state.answered else self.idle_timeout
        return now - state.last_call_at < timeout

    def _open(self, session_key: str | None, now: float) -> TrajectoryState:
        state = TrajectoryState(new_id(), session_key, now, now)
        self._by_id[state.id] = state
        return state

    def _take_continuation(self, digest: str, now: float) -> TrajectoryState | None:
        waiting = self._continuations.get(digest)
        while waiting:
            state = self._by_id.get(waiting.pop(0))
            if not waiting:
                del self._continuations[digest]
                self._prune_at.pop(digest, None)
            if state is not None and self._alive(state, now):
                return state
            waiting = self._continuations.get(digest)
        return None
