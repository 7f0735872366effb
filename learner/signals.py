"""Next-turn signals as the learner uses them: read off a trajectory by the certain rules
(store/next_turn.py) and, optionally, a judge for the turns they are silent on
(learner/graders/turn_judge.py); each weighed by its client key's weight
(`learn --signal-weight NAME=WEIGHT`); kept in the next_turn grade's detail, stored per turn
(store/turn_signals.py) and read back by per-turn credit (learner/turn_credit.py).

A signal judges an assistant turn; the key it counts under is that turn's call's key (a
person's words come in on the next call, under the same session and, in practice, the same
key). Weight 0 switches a key's signals off: they are stored (so the dashboard still shows
them) but count for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from store.conversation import conversation
from store.json_types import JsonObject, JsonValue
from store.next_turn import next_turn_signals, open_turns
from store.trajectory_record import Trajectory
from store.turn_signals import Stored

if TYPE_CHECKING:
    from learner.graders.turn_judge import TurnJudge

ANY_KEY = "*"
SIGNALS_KEY = "signals"  # where the next_turn grader lists them in its grade's detail


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


def weighed_signals(
    trajectory: Trajectory, weights: SignalWeights, judge: TurnJudge | None = None
) -> list[Stored]:
    """The trajectory's next-turn signals, each with its call's key and that key's weight:
    the rules', then, with `judge`, the judge's on the turns the user answered and the
    rules are silent on (a transport failure of the judge raises)."""
    calls = trajectory.calls
    key_of = {c.id: c.key_name for c in calls}
    model_of = {c.id: c.model for c in calls}
    messages = conversation(calls)
    certain = next_turn_signals(messages)
    found = [(s, "rule") for s in certain]
    if judge is not None:
        for turn in open_turns(messages, certain):
            judged = judge.judge(turn, model=model_of.get(turn.call_id))
            if judged is not None:
                found.append((judged, "judge"))
    return sorted(
        (
            Stored(
                call_id=s.call_id,
                turn=s.turn,
                value=s.value,
                rule=s.rule,
                evidence=s.evidence,
                key_name=key_of.get(s.call_id),
                weight=weights.of(key_of.get(s.call_id)),
                source=source,
            )
            for s, source in found
        ),
        key=lambda s: s.turn,
    )


def signals_off(trajectory: Trajectory, weights: SignalWeights) -> str | None:
    """The key whose signals are off, when every call of the trajectory came with such a
    key (then nothing the traffic said of it may count), else None."""
    keys = {c.key_name for c in trajectory.calls}
    off = sorted(k or "(no key)" for k in keys if weights.of(k) == 0.0)
    if keys and len(off) == len(keys):
        return ", ".join(off)
    return None


def as_detail(signals: Iterable[Stored]) -> list[JsonObject]:
    return [asdict(s) for s in signals]


def signals_in(detail: Mapping[str, JsonValue] | None) -> list[Stored] | None:
    """The signals a grade's detail holds: the next_turn grader's own, or its entry in a
    combination (learner/graders/combine.py); None when it holds none."""
    if not detail:
        return None
    listed = detail.get(SIGNALS_KEY)
    if listed is None:
        for entry in detail.values():
            inner = entry.get("detail") if isinstance(entry, Mapping) else None
            if isinstance(inner, Mapping) and SIGNALS_KEY in inner:
                listed = inner[SIGNALS_KEY]
                break
    if listed is None:
        return None
    return [
        Stored(
            call_id=str(s["call_id"]),
            turn=int(s.get("turn", 0)),
            value=float(s["value"]),
            rule=str(s.get("rule", "")),
            evidence=str(s.get("evidence", "")),
            key_name=s.get("key_name"),
            weight=float(s.get("weight", 1.0)),
            source=str(s.get("source", "rule")),
        )
        for s in listed
    ]
