"""Curricula (`onthejob rollout --curriculum`): where each stands, and its stage over time.

Read from the curriculum tables (store/curricula.py): the current stage,
every promotion (from, to, the version that answered the eval that passed, the metrics
that passed the rule), a timeline of the stages with when each began and ended, and the
evals of every stage.
"""

from __future__ import annotations

from typing import Annotated, NotRequired, TypedDict, cast

from fastapi import APIRouter, Path, Query
from sqlalchemy import Connection

from proxy.admin.deps import EngineDep
from proxy.admin.errors import not_found
from proxy.admin.schemas import Key
from store import curricula
from store.clock import iso
from store.curricula import CurriculumState, EvalRow, PromotionRow, StageState
from store.json_types import JsonObject

router = APIRouter(tags=["curricula"])


class Promotion(TypedDict):
    from_stage: str
    to_stage: str | None
    policy_version: str | None
    metrics: JsonObject
    at: str | None


class Eval(TypedDict):
    stage: str
    rollout_id: str
    policy_version: str | None
    stage_round: int
    runs: int
    k: int
    pass_at_1: float | None
    mean_reward: float | None
    pass_at_k: float | None
    at: str | None


class Span(TypedDict):
    """A stage on the timeline: `until` None while it is the current one."""

    stage: str | None
    since: str | None
    until: str | None
    promoted: Promotion | None


class Stage(StageState):
    index: int
    status: str  # passed | current | pending


class CurriculumItem(TypedDict):
    name: str
    path: str | None
    stage: str | None
    stage_index: int | None
    complete: bool
    stage_since: str | None
    stage_rounds: int
    rounds: int
    started_at: str | None
    updated_at: str | None
    completed_at: str | None
    stages: list[Stage]
    promotions: list[Promotion]
    timeline: list[Span]
    evals: NotRequired[list[Eval]]  # one curriculum's


class CurriculumList(TypedDict):
    items: list[CurriculumItem]


def _promotion(row: PromotionRow) -> Promotion:
    return {
        "from_stage": row["from_stage"],
        "to_stage": row["to_stage"],
        "policy_version": row["policy_version"],
        "metrics": row["metrics"],
        "at": iso(row["created_at"]),
    }


def _eval(row: EvalRow) -> Eval:
    return {
        "stage": row["stage"],
        "rollout_id": row["rollout_id"],
        "policy_version": row["policy_version"],
        "stage_round": row["stage_round"],
        "runs": row["runs"],
        "k": row["k"],
        "pass_at_1": row["pass_at_1"],
        "mean_reward": row["mean_reward"],
        "pass_at_k": row["pass_at_k"],
        "at": iso(row["created_at"]),
    }


def _timeline(state: CurriculumState, promotions: list[PromotionRow]) -> list[Span]:
    """The stages in the order the curriculum went through them: since, until (None: the
    current one), the promotion that ended each."""
    first = (state["stages"] or [cast(StageState, {})])[0].get("name")
    if promotions:
        first = promotions[0]["from_stage"]
    spans: list[Span] = [
        {"stage": first, "since": iso(state["started_at"]), "until": None, "promoted": None}
    ]
    for promotion in promotions:
        spans[-1]["until"] = iso(promotion["created_at"])
        spans[-1]["promoted"] = _promotion(promotion)
        if promotion["to_stage"] is not None:
            spans.append(
                {
                    "stage": promotion["to_stage"],
                    "since": iso(promotion["created_at"]),
                    "until": None,
                    "promoted": None,
                }
            )
    return spans


def _item(conn: Connection, state: CurriculumState) -> CurriculumItem:
    promotions = curricula.promotions(conn, state["name"])
    passed = {p["from_stage"]: p for p in promotions}
    stages: list[Stage] = []
    for index, stage in enumerate(state["stages"] or []):
        if stage["name"] in passed and stage["name"] != state["stage"]:
            status = "passed"
        elif stage["name"] == state["stage"]:
            status = "current"
        else:
            status = "pending"
        stages.append({**stage, "index": index, "status": status})
    return {
        "name": state["name"],
        "path": state["path"],
        "stage": state["stage"],
        "stage_index": state["stage_index"],
        "complete": state["stage"] is None,
        "stage_since": iso(state["stage_since"]),
        "stage_rounds": state["stage_rounds"],
        "rounds": state["rounds"],
        "started_at": iso(state["started_at"]),
        "updated_at": iso(state["updated_at"]),
        "completed_at": iso(state["completed_at"]),
        "stages": stages,
        "promotions": [_promotion(p) for p in promotions],
        "timeline": _timeline(state, promotions),
    }


@router.get(
    "/curricula",
    summary="Every curriculum: current stage, promotions, timeline",
    response_model=dict,  # serialised as returned (CurriculumList)
)
def list_curricula(engine: EngineDep) -> CurriculumList:
    """The most recently active first. `stages[].status`: passed, current or pending;
    `complete`: every stage passed (`stage` is then null)."""
    with engine.connect() as conn:
        return {"items": [_item(conn, s) for s in curricula.curricula(conn)]}


@router.get(
    "/curricula/{name}",
    summary="One curriculum with the evals of its stages",
    response_model=dict,  # serialised as returned (CurriculumItem)
)
def get_curriculum(
    engine: EngineDep,
    name: Annotated[Key, Path()],
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> CurriculumItem:
    """As in the list, plus `evals`: the latest `limit` evals, oldest first, each with its
    stage, the version that answered most of its runs, pass@1, mean reward and pass@k."""
    with engine.connect() as conn:
        state = curricula.state(conn, name)
        if state is None:
            raise not_found("curriculum", name)
        item = _item(conn, state)
        item["evals"] = [_eval(e) for e in curricula.evals(conn, name, limit=limit)]
    return item
