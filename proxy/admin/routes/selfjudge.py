"""The self-judge's agreement with the ground truth, per interaction type."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from proxy.admin import selfjudge
from proxy.admin.deps import EngineDep
from proxy.admin.schemas import Time
from proxy.admin.selfjudge import TypeAgreement
from store.clock import iso

router = APIRouter(tags=["self-judge"])


class SelfJudgeQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Time = Field(None, description="graded at or after (ISO 8601; naive = UTC)")
    limit: int = Field(10_000, ge=1, le=100_000, description="the newest this many verdicts")


class SelfJudge(TypedDict):
    since: str | None
    pass_threshold: float
    verdicts: int
    types: list[TypeAgreement]


@router.get(
    "/self-judge",
    summary="How well the self-judge agrees with the ground truth",
    response_model=dict,  # serialised as returned (SelfJudge)
)
def get_self_judge(engine: EngineDep, query: Annotated[SelfJudgeQuery, Query()]) -> SelfJudge:
    """Per interaction type: trajectories the served model graded itself (and their mean
    reward), and over those that also have a ground truth (reference answer, check, people's
    feedback) the share where the judge's pass (reward >= 0.5) equals the truth's, with n,
    both pass rates and the correlation of the rewards; by truth source too."""
    with engine.connect() as conn:
        rows = selfjudge.verdicts(conn, since=query.since, limit=query.limit)
    return {
        "since": iso(query.since) if query.since else None,
        "pass_threshold": selfjudge.PASS,
        "verdicts": len(rows),
        "types": selfjudge.agreement(rows),
    }
