"""How well the self-judge agrees with the ground truth, per interaction type.

The learner keeps the self-judge's verdict in a grade's detail under "self_judge"
(learner/graders/selfjudge.py): with "truth" (source, reward) for a trajectory a reference
answer, a check or people's feedback graded, the verdict being a shadow that changed
nothing; without it for one the self-judge graded. Feedback posted later on a self-judged
trajectory is a ground truth too ("feedback_later").

Pass is reward >= PASS for judge and truth alike; agreement is the share of verdicts whose
pass equals the truth's, with n; correlation is Pearson's r of the two rewards (None when
either is constant or n < 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import TypedDict, cast

from sqlalchemy import Connection

from store import feedback, grade_queue
from store.json_types import JsonObject, JsonValue

PASS = 0.5
SELF_JUDGE = "self_judge"


class VerdictFields(TypedDict):
    """A self-judge entry of a grade's detail (open JSON: its values as the learner kept
    them)."""

    type: JsonValue  # the interaction type
    judge: float | None  # the judge's reward
    error: JsonValue
    truth_source: JsonValue  # None: no ground truth; "feedback_later": joined in
    truth: float | None


class Verdict(VerdictFields):
    trajectory_id: str


class Figures(TypedDict):
    compared: int
    agreeing: int
    agreement: float | None
    judge_pass_rate: float | None
    truth_pass_rate: float | None
    correlation: float | None


class TypeAgreement(Figures):
    type: JsonValue
    self_judged: int
    self_judged_mean_reward: float | None
    judge_errors: int
    by_source: dict[str, Figures]  # per truth source


def verdicts(conn: Connection, *, since: datetime | None, limit: int) -> list[Verdict]:
    """The newest `limit` self-judge entries graded at or after `since`: type, judge reward,
    truth (source, reward) or None, error; later feedback joined in as a truth."""
    rows: list[Verdict] = []
    for trajectory_id, detail in grade_queue.grade_details_with(
        conn, SELF_JUDGE, since=since, limit=limit
    ):
        entry = (detail or {}).get(SELF_JUDGE)
        if isinstance(entry, dict):
            rows.append(cast(Verdict, {"trajectory_id": trajectory_id, **_verdict(entry)}))
    _join_later_feedback(conn, rows)
    return rows


def _verdict(entry: JsonObject) -> VerdictFields:
    truth = entry.get("truth") if isinstance(entry.get("truth"), dict) else None
    return {
        "type": entry.get("type"),
        "judge": _number(entry.get("reward")),
        "error": entry.get("error"),
        "truth_source": truth.get("source") if truth else None,
        "truth": _number(truth.get("reward")) if truth else None,
    }


def _join_later_feedback(conn: Connection, rows: list[Verdict]) -> None:
    judged = [r for r in rows if r["truth_source"] is None and r["judge"] is not None]
    latest = feedback.latest_rewards(conn, [r["trajectory_id"] for r in judged])
    for row in judged:
        if row["trajectory_id"] in latest:
            row["truth_source"], row["truth"] = "feedback_later", latest[row["trajectory_id"]]


def agreement(rows: Iterable[Verdict]) -> list[TypeAgreement]:
    """Per interaction type (None: untyped), most compared first."""
    by_type: dict[JsonValue, list[Verdict]] = {}
    for row in rows:
        by_type.setdefault(row["type"], []).append(row)
    out: list[TypeAgreement] = []
    for kind, members in by_type.items():
        graded = [r for r in members if r["truth_source"] in (None, "feedback_later")]
        graded = [r for r in graded if r["judge"] is not None]
        compared = [r for r in members if r["truth"] is not None and r["judge"] is not None]
        sources = sorted({r["truth_source"] for r in compared})
        out.append(
            cast(
                TypeAgreement,
                {
                    "type": kind,
                    "self_judged": len(graded),
                    "self_judged_mean_reward": _mean([r["judge"] for r in graded]),
                    "judge_errors": sum(r["error"] is not None for r in members),
                    **_figures(compared),
                    "by_source": {
                        source: _figures([r for r in compared if r["truth_source"] == source])
                        for source in sources
                    },
                },
            )
        )
    out.sort(key=lambda t: (-t["compared"], str(t["type"])))
    return out


def _figures(compared: list[Verdict]) -> Figures:
    judge = [r["judge"] for r in compared]
    truth = [r["truth"] for r in compared]
    agree = sum((j >= PASS) == (t >= PASS) for j, t in zip(judge, truth, strict=True))
    return {
        "compared": len(compared),
        "agreeing": agree,
        "agreement": agree / len(compared) if compared else None,
        "judge_pass_rate": _mean([float(j >= PASS) for j in judge]),
        "truth_pass_rate": _mean([float(t >= PASS) for t in truth]),
        "correlation": pearson(judge, truth),
    }


def pearson(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _number(value: JsonValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
