"""Stored next-turn signals: written when the learner grades a trajectory, read by the
admin API per trajectory and per client key, with the one-sided-burst flag. Callers own the
transaction.

The flag: a person can steer what the model learns by what they say after its answers. A key
whose word signals (a correction, an approval, a retry, an interruption: what a person
types, not what a tool returns) in the window are at least `BURST_MIN` and at least
`BURST_SHARE` of one sign is flagged when the rest of the traffic has at least `BURST_MIN`
word signals too and is at least `BURST_GAP` less one-sided (with nothing to compare with,
a model its only user corrects most of the time is not a burst). The numbers behind the
flag go with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection, delete, insert, select

from store.models import Call, TurnSignal

# what a person types: the rules on their words, and the judge's reading of them
WORD_RULES = frozenset({"corrected", "approved", "retried", "interrupted", "judged"})
BURST_MIN = 20
BURST_SHARE = 0.9
BURST_GAP = 0.3


class StoredSignal(TypedDict):
    """A trajectory's stored signal as the admin API shows it."""

    call_id: str
    turn: int
    value: float
    weight: float
    rule: str
    source: str  # rule | judge
    evidence: str
    key_name: str | None


class SignalCounts(TypedDict):
    signals: int
    good: int
    bad: int
    good_share: float | None  # None: no signal


class KeySignals(SignalCounts):
    """A client key's signals in the window (`key_name` None: calls without a key)."""

    key_name: str | None
    words: SignalCounts
    rest_words: SignalCounts
    flagged: bool
    reason: str | None


@dataclass(frozen=True)
class Stored:
    """One signal as the learner stores it."""

    call_id: str
    turn: int
    value: float
    rule: str
    evidence: str
    key_name: str | None
    weight: float = 1.0
    source: str = "rule"


def save_signals(
    conn: Connection, *, trajectory_id: str, signals: Sequence[Stored], now: datetime
) -> None:
    """The trajectory's signals, replacing those a previous grading stored."""
    conn.execute(delete(TurnSignal).where(TurnSignal.trajectory_id == trajectory_id))
    if signals:
        conn.execute(
            insert(TurnSignal),
            [{"trajectory_id": trajectory_id, "created_at": now, **s.__dict__} for s in signals],
        )


def save_run_signals(
    conn: Connection, *, trajectory_ids: Sequence[str], signals: Sequence[Stored], now: datetime
) -> None:
    """A rollout run's signals (one grade for all its trajectories), each stored with the
    trajectory its call belongs to."""
    owner = dict(
        conn.execute(
            select(Call.id, Call.trajectory_id).where(Call.trajectory_id.in_(list(trajectory_ids)))
        ).all()
    )
    for trajectory_id in trajectory_ids:
        mine = [s for s in signals if owner.get(s.call_id) == trajectory_id]
        save_signals(conn, trajectory_id=trajectory_id, signals=mine, now=now)


def signals_by_trajectory(conn: Connection, ids: Sequence[str]) -> dict[str, list[Stored]]:
    """The stored signals of each of these trajectories that has any, in one read."""
    found: dict[str, list[Stored]] = {}
    if not ids:
        return found
    t = TurnSignal
    rows = conn.execute(
        select(t.trajectory_id, t.call_id, t.turn, t.value, t.rule, t.evidence, t.key_name,
               t.weight, t.source)
        .where(t.trajectory_id.in_(list(ids)))
        .order_by(t.trajectory_id, t.turn)
    )  # fmt: skip
    for row in rows:
        trajectory_id, *fields = row
        found.setdefault(trajectory_id, []).append(Stored(*fields))
    return found


def signals_of(conn: Connection, trajectory_id: str) -> list[StoredSignal]:
    t = TurnSignal
    query = select(t.call_id, t.turn, t.value, t.weight, t.rule, t.source, t.evidence, t.key_name)
    rows = conn.execute(query.where(t.trajectory_id == trajectory_id).order_by(t.turn))
    return [cast(StoredSignal, dict(r._mapping)) for r in rows]


def _counts(values: list[float]) -> SignalCounts:
    good = sum(v > 0 for v in values)
    bad = sum(v < 0 for v in values)
    return {
        "signals": len(values),
        "good": good,
        "bad": bad,
        "good_share": good / len(values) if values else None,
    }


def by_key(conn: Connection, *, since: datetime) -> list[KeySignals]:
    """Per client key (None: calls without one), the signals stored since `since`: all of
    them and the word signals, with the burst flag and its reason."""
    rows = conn.execute(
        select(TurnSignal.key_name, TurnSignal.rule, TurnSignal.value).where(
            TurnSignal.created_at >= since
        )
    ).all()
    keys = sorted({r.key_name for r in rows}, key=lambda k: (k is None, k or ""))
    result: list[KeySignals] = []
    for key in keys:
        mine = [r for r in rows if r.key_name == key]
        words = [r.value for r in mine if r.rule in WORD_RULES]
        rest = [r.value for r in rows if r.key_name != key and r.rule in WORD_RULES]
        entry = cast(
            KeySignals,
            {
                "key_name": key,
                **_counts([r.value for r in mine]),
                "words": _counts(words),
                "rest_words": _counts(rest),
            },
        )
        entry["flagged"], entry["reason"] = _burst(entry["words"], entry["rest_words"])
        result.append(entry)
    return result


def _burst(words: SignalCounts, rest: SignalCounts) -> tuple[bool, str | None]:
    if words["signals"] < BURST_MIN:
        return False, None
    share = words["good_share"]
    side, one_sided = ("good", share) if share >= 0.5 else ("bad", 1 - share)
    if one_sided < BURST_SHARE:
        return False, None
    if rest["signals"] < BURST_MIN:
        # nothing to compare with: a model corrected most of the time by its only user is
        # not a burst
        return False, None
    rest_share = rest["good_share"] if side == "good" else 1 - rest["good_share"]
    if one_sided - rest_share < BURST_GAP:
        return False, None
    return True, (
        f"{words['signals']} word signals, {100 * one_sided:.0f}% {side}; "
        f"the other keys' are {100 * rest_share:.0f}% {side}"
    )
