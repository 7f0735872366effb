"""What the reward-hacking watch reads (learner/canary/watch.py): per trajectory of two
windows, the version under watch's (`after`) and the version it is compared with
(`before`), what the store recorded of it.

The windows are a running canary's arms (its candidate against its incumbent, in its scope,
since it started: a trajectory is the version's that answered its first call, as in
canary_stats), or, where no canary runs, the shared policy's newest verified version against
the one before it, each over its newest trajectories of the last `RECENT`. At most `LIMIT`
trajectories per window, the newest: the learner looks every few seconds.

Per trajectory, only what is recorded: its grade (reward, and a self-judge verdict given
beside a ground truth); whether a next-turn signal on its calls was negative (a correction,
a retry, a tool error); the completion tokens and the text and tool calls of its replies (the
recorded response bodies, whatever API). A tool call "fails to parse" where its recorded
arguments are not a JSON object; a call vLLM's tool parser gave up on is recorded as text,
which says nothing certain, so it is not counted. The keys whose feedback store/turn_signals
flags as a one-sided burst since the window began come with the windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from sqlalchemy import ColumnElement, Connection, select

from store import policy_versions, turn_signals
from store.canaries import SHARED
from store.conversation import reply_messages
from store.json_types import JsonObject
from store.models import Call, Grade, Trajectory, TurnSignal

LIMIT = 1000  # trajectories per window, the newest
RECENT = timedelta(days=1)  # the newest-version watch's window
SELF_JUDGE = "self_judge"  # where a grade's detail keeps the self-judge's verdict
PASS = 0.5  # a reward at or above it passes (as the admin API's agreement figures)


@dataclass(frozen=True)
class Reply:
    """One reply of a trajectory: its text, and its tool calls (how many; how many of them
    with arguments that are not a JSON object)."""

    text: str
    tool_calls: int = 0
    broken_tool_calls: int = 0


@dataclass(frozen=True)
class Served:
    """One trajectory of a window, as recorded."""

    trajectory_id: str
    reward: float | None = None  # None: not graded yet, or graded without one
    graded: bool = False
    complained: bool = False  # a negative next-turn signal on any of its calls
    reply_tokens: int | None = None  # mean completion tokens per reply; None: none known
    replies: tuple[Reply, ...] = ()
    judge_disagrees: bool | None = None  # None: no self-judge verdict beside a ground truth


@dataclass(frozen=True)
class FlaggedKey:
    """A client key whose feedback store/turn_signals flags as a one-sided burst."""

    key_name: str | None
    reason: str


@dataclass(frozen=True)
class WatchWindows:
    scope: str  # a tenant's name, or SHARED
    version: str  # under watch
    baseline: str | None  # compared with; None: every other version (an unknown incumbent)
    before: list[Served]
    after: list[Served]
    signals_recorded: bool  # any next-turn signal stored in either window
    flagged_keys: list[FlaggedKey]
    canary_id: int | None = None


def canary_windows(
    conn: Connection,
    *,
    canary_id: int,
    tenant: str | None,
    candidate: str,
    incumbent: str | None,
    since: datetime,
    until: datetime,
) -> WatchWindows:
    """A canary's arms: the candidate's trajectories (`after`) against the incumbent's."""
    after = _trajectories(conn, tenant, [candidate], since, until, exclude=None)
    before = _trajectories(
        conn,
        tenant,
        [] if incumbent is None else [incumbent],
        since,
        until,
        exclude=candidate if incumbent is None else None,
    )
    return _windows(
        conn, SHARED if tenant is None else tenant, candidate, incumbent, before, after, since,
        canary_id=canary_id,
    )  # fmt: skip


def newest_windows(conn: Connection, *, now: datetime) -> WatchWindows | None:
    """The shared policy's newest verified version against the one before (None: fewer than
    two), each over its newest trajectories of the last RECENT."""
    versions = policy_versions.lineage_newest_first(conn)[:2]
    if len(versions) < 2:
        return None
    newest, before = versions
    since = now - RECENT
    return _windows(
        conn,
        SHARED,
        newest,
        before,
        _trajectories(conn, None, [before], since, now, exclude=None),
        _trajectories(conn, None, [newest], since, now, exclude=None),
        since,
    )


def _windows(
    conn: Connection,
    scope: str,
    version: str,
    baseline: str | None,
    before_ids: list[str],
    after_ids: list[str],
    since: datetime,
    *,
    canary_id: int | None = None,
) -> WatchWindows:
    ids = before_ids + after_ids
    grades = _grades(conn, ids)
    complained, signalled = _complaints(conn, ids)
    replies, tokens = _replies(conn, ids)

    def served(trajectory_id: str) -> Served:
        reward, detail = grades.get(trajectory_id, (None, None))
        return Served(
            trajectory_id=trajectory_id,
            reward=reward,
            graded=trajectory_id in grades,
            complained=trajectory_id in complained,
            reply_tokens=tokens.get(trajectory_id),
            replies=tuple(replies.get(trajectory_id, ())),
            judge_disagrees=_judge_disagrees(detail),
        )

    return WatchWindows(
        scope=scope,
        version=version,
        baseline=baseline,
        before=[served(t) for t in before_ids],
        after=[served(t) for t in after_ids],
        signals_recorded=bool(signalled),
        flagged_keys=[
            FlaggedKey(entry["key_name"], str(entry["reason"]))
            for entry in turn_signals.by_key(conn, since=since)
            if entry["flagged"]
        ],
        canary_id=canary_id,
    )


def _first_call(column: ColumnElement[str | None]) -> ColumnElement[str | None]:
    """The column of a trajectory's first call (whose version the trajectory is)."""
    return (
        select(column)
        .where(Call.trajectory_id == Trajectory.id)
        .order_by(Call.started_at, Call.id)
        .limit(1)
        .correlate(Trajectory)
        .scalar_subquery()
    )


def _trajectories(
    conn: Connection,
    tenant: str | None,
    versions: Sequence[str],
    since: datetime,
    until: datetime,
    *,
    exclude: str | None,
) -> list[str]:
    """The newest LIMIT trajectories of the scope whose first call one of `versions`
    answered (with `exclude`: any version but it)."""
    version, owner = _first_call(Call.policy_version), _first_call(Call.tenant)
    answered = version.is_not(None) & (version != exclude) if exclude else version.in_(versions)
    rows = conn.execute(
        select(Trajectory.id)
        .where(
            Trajectory.started_at >= since,
            Trajectory.started_at <= until,
            owner.is_(None) if tenant is None else owner == tenant,
            answered,
        )
        .order_by(Trajectory.started_at.desc(), Trajectory.id)
        .limit(LIMIT)
    )
    return [trajectory_id for (trajectory_id,) in rows]


def _grades(conn: Connection, ids: list[str]) -> dict[str, tuple[float | None, JsonObject | None]]:
    if not ids:
        return {}
    rows = conn.execute(
        select(Grade.trajectory_id, Grade.reward, Grade.detail).where(Grade.trajectory_id.in_(ids))
    )
    return {t: (reward, detail) for t, reward, detail in rows}


def _complaints(conn: Connection, ids: list[str]) -> tuple[set[str], set[str]]:
    """The trajectories with a negative next-turn signal, and those with any signal."""
    if not ids:
        return set(), set()
    rows = conn.execute(
        select(TurnSignal.trajectory_id, TurnSignal.value).where(TurnSignal.trajectory_id.in_(ids))
    ).all()
    return {t for t, value in rows if value < 0}, {t for t, _ in rows}


def _replies(conn: Connection, ids: list[str]) -> tuple[dict[str, list[Reply]], dict[str, int]]:
    """Each trajectory's replies in call order, and its mean completion tokens per call."""
    replies: dict[str, list[Reply]] = {}
    tokens: dict[str, list[int]] = {}
    if not ids:
        return replies, {}
    rows = conn.execute(
        select(Call.trajectory_id, Call.id, Call.api, Call.response, Call.completion_tokens)
        .where(Call.trajectory_id.in_(ids), Call.status == "ok")
        .order_by(Call.started_at, Call.id)
    )
    for trajectory_id, call_id, api, response, completion_tokens in rows:
        if completion_tokens is not None:
            tokens.setdefault(trajectory_id, []).append(completion_tokens)
        for message in reply_messages(api, response, call_id):
            if message["role"] != "assistant":
                continue
            calls = message["tool_calls"]
            broken = sum(not _json_object(c["arguments"]) for c in calls)
            replies.setdefault(trajectory_id, []).append(Reply(message["text"], len(calls), broken))
    means = {t: round(sum(n) / len(n)) for t, n in tokens.items() if n}
    return replies, means


def _json_object(arguments: str) -> bool:
    try:
        return isinstance(orjson.loads(arguments or "{}"), dict)
    except orjson.JSONDecodeError:
        return False


def _judge_disagrees(detail: JsonObject | None) -> bool | None:
    """A self-judge verdict given beside a ground truth: whether they disagree on pass."""
    entry = (detail or {}).get(SELF_JUDGE)
    if not isinstance(entry, dict):
        return None
    truth, judged = entry.get("truth"), entry.get("reward")
    if not isinstance(truth, dict) or not isinstance(judged, int | float):
        return None
    reward = truth.get("reward")
    if not isinstance(reward, int | float):
        return None
    return (judged >= PASS) != (reward >= PASS)
