"""Rewards from operators: post or correct the reward of a trajectory or a session.

Stored like POST /v1/onthejob/feedback (the feedback grader reads it). A trajectory that is
graded but not trained on yet gets its grade corrected at once, so the learner trains on
the operator's reward; one already trained on keeps its grade (the step is history) and
only shows the new reward.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import APIRouter, Query

from proxy.admin.deps import EngineDep
from proxy.admin.errors import not_found
from proxy.admin.schemas import FeedbackIn, Key
from store import trajectory_views
from store.feedback import add_feedback, correct_reward, feedback_targets
from store.trajectory_views import FeedbackView

router = APIRouter(tags=["rewards"])


class FeedbackPosted(TypedDict):
    ok: bool
    reward: float
    comment: str | None
    trajectory_id: str | None
    session: str | None
    trajectories: list[str]  # the trajectories it is for
    grades_corrected: list[str]  # those whose grade no step trained on yet


class FeedbackList(TypedDict):
    items: list[FeedbackView]


@router.post(
    "/feedback",
    status_code=201,
    summary="Post or correct a reward",
    response_model=dict,  # serialised as returned (FeedbackPosted)
)
def post_feedback(engine: EngineDep, body: FeedbackIn) -> FeedbackPosted:
    """Give exactly one of `trajectory_id` or `session` (all its trajectories)."""
    with engine.begin() as conn:
        targets = feedback_targets(conn, trajectory_id=body.trajectory_id, session_key=body.session)
        if not targets:
            what = "trajectory" if body.trajectory_id is not None else "session"
            raise not_found(what, body.trajectory_id or body.session or "")
        add_feedback(
            conn,
            reward=body.reward,
            trajectory_id=body.trajectory_id,
            session_key=body.session,
            comment=body.comment,
        )
        corrected = [
            t
            for t in targets
            if correct_reward(conn, trajectory_id=t, reward=body.reward, comment=body.comment)
        ]
    return {
        "ok": True,
        "reward": body.reward,
        "comment": body.comment,
        "trajectory_id": body.trajectory_id,
        "session": body.session,
        "trajectories": targets,
        "grades_corrected": corrected,
    }


@router.get(
    "/feedback",
    summary="Recent feedback",
    response_model=dict,  # serialised as returned (FeedbackList)
)
def list_feedback(
    engine: EngineDep,
    trajectory_id: Annotated[Key | None, Query()] = None,
    session: Annotated[Key | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> FeedbackList:
    with engine.connect() as conn:
        items = trajectory_views.feedback_for(
            conn, trajectory_id=trajectory_id, session_key=session, limit=limit
        )
    return {"items": items}
