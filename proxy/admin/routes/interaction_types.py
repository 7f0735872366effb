"""Interaction types: trajectories, mean reward and success per type and policy version."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Query

from proxy.admin.deps import EngineDep
from proxy.admin.schemas import TypesQuery
from store import interaction_types
from store.interaction_types import TypeFigures

router = APIRouter(tags=["types"])


class Types(TypedDict):
    success_at: float
    types: list[TypeFigures]


@router.get(
    "/types",
    summary="Per interaction type and policy version: rewards and success",
    response_model=dict,  # serialised as returned (Types)
)
def get_types(engine: EngineDep, query: Annotated[TypesQuery, Query()]) -> Types:
    """Every interaction type (X-Onthejob-Type, else the auto: fingerprint; null: recorded
    before types were) with its trajectories, graded ones, mean reward and success rate
    (reward >= `success_at`, over graded ones), overall and by the policy version of each
    trajectory's first call; trajectories started in [since, until) when given."""
    with engine.connect() as conn:
        types = interaction_types.by_type(
            conn,
            success_at=query.success_at,
            since=query.since,
            until=query.until,
            interaction_type=query.type,
        )
    return {"success_at": query.success_at, "types": types}
