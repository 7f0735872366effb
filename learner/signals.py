"""Next-turn signals as the learner uses them: each weighed by its client key's weight
(`learn --signal-weight NAME=WEIGHT`), stored per turn (store/turn_signals.py) and read by
the next_turn grader.

A signal judges an assistant turn; the key it counts under is that turn's call's key (a
person's words come in on the next call, under the same session and, in practice, the same
key). Weight 0 switches a key's signals off: they are stored (so the dashboard still shows
them) but count for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from store.conversation import conversation
from store.next_turn import next_turn_signals
from store.turn_signals import Stored

ANY_KEY = "*"


@dataclass(frozen=True)
class SignalWeights:
    by_key: dict[str, float] = field(default_factory=dict)
    default: float = 1.0

    @classmethod
    def parse(cls, entries: Iterable[str]) -> SignalWeights:
        """From NAME=WEIGHT entries; ValueError naming a bad one."""
        by_key: dict[str, float] = {}
        default = 1.0
        for entry in entries:
            name, eq, text = entry.partition("=")
            name = name.strip()
            try:
                weight = float(text) if eq else float("nan")
            except ValueError:
                weight = float("nan")
            if not name or not 0.0 <= weight < float("inf"):
                raise ValueError(
                    f"signal weight {entry!r}: expected NAME=WEIGHT with a weight >= 0, "
                    f"e.g. alice=0.5 or *=0"
                )
            if name == ANY_KEY:
                default = weight
            else:
                by_key[name] = weight
        return cls(by_key, default)

    def of(self, key_name: str | None) -> float:
        return self.by_key.get(key_name, self.default) if key_name else self.default


def weighed_signals(trajectory: dict[str, Any], weights: SignalWeights) -> list[Stored]:
    """The trajectory's next-turn signals, each with its call's key and that key's weight."""
    calls = trajectory.get("calls") or []
    key_of = {str(c.get("id")): c.get("key_name") for c in calls}
    return [
        Stored(
            call_id=s.call_id,
            turn=s.turn,
            value=s.value,
            rule=s.rule,
            evidence=s.evidence,
            key_name=key_of.get(s.call_id),
            weight=weights.of(key_of.get(s.call_id)),
        )
        for s in next_turn_signals(conversation(calls))
    ]


def signals_off(trajectory: dict[str, Any], weights: SignalWeights) -> str | None:
    """The key whose signals are off, when every call of the trajectory came with such a
    key (then nothing the traffic said of it may count), else None."""
    keys = {c.get("key_name") for c in trajectory.get("calls") or []}
    off = sorted(k or "(no key)" for k in keys if weights.of(k) == 0.0)
    if keys and len(off) == len(keys):
        return ", ".join(off)
    return None
