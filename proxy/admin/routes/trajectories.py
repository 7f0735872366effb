"""Trajectories: list (filters, cursor pages), one with its conversation and tokens, export."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import orjson
from fastapi import APIRouter, Path, Query
from fastapi.responses import StreamingResponse

from proxy.admin.deps import DetokenizerDep, EngineDep
from proxy.admin.errors import not_found
from proxy.admin.page_cursor import decode_cursor, encode_cursor
from proxy.admin.schemas import TrajectoryFilter, TrajectoryPage
from proxy.admin.tokens import TokenSequence, token_sequences
from store import trajectory_views, turn_signals
from store.conversation import Message, conversation
from store.export import ExportedTrajectory, iter_trajectories, to_export
from store.next_turn import TurnSignalFields, next_turn_signals
from store.trajectory_loading import load_trajectories
from store.trajectory_views import FeedbackView, GradeView, TrajectorySummary
from store.turn_signals import StoredSignal

router = APIRouter(tags=["trajectories"])
EXPORT_CHUNK = 200
TrajectoryId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class TrajectoryList(TypedDict):
    items: list[TrajectorySummary]
    next_cursor: str | None  # None: the last page


class TrajectoryDetail(ExportedTrajectory):
    """The export format plus what the admin API adds."""

    grade: GradeView | None
    feedback: list[FeedbackView]
    messages: list[Message]
    signals: list[StoredSignal] | list[TurnSignalFields]
    tokens: list[TokenSequence]


@router.get(
    "/trajectories",
    summary="List trajectories, newest first",
    response_model=dict,  # serialised as returned (TrajectoryList)
)
def list_trajectories(
    engine: EngineDep, page: Annotated[TrajectoryPage, Query()]
) -> TrajectoryList:
    """A page of trajectories matching every filter given; pass `next_cursor` back as
    `cursor` for the next page (null on the last one)."""
    after = None if page.cursor is None else decode_cursor(page.cursor)
    with engine.connect() as conn:
        items, next_after = trajectory_views.list_page(conn, f=page, limit=page.limit, after=after)
    return {
        "items": items,
        "next_cursor": None if next_after is None else encode_cursor(*next_after),
    }


def _detail(engine: Any, trajectory_id: str) -> TrajectoryDetail:
    found = list(load_trajectories(engine, ids=[trajectory_id]))
    if not found:
        raise not_found("trajectory", trajectory_id)
    trajectory = found[0]
    with engine.connect() as conn:
        grade = trajectory_views.grade_of(conn, trajectory_id=trajectory_id)
        feedback = trajectory_views.feedback_for(
            conn, trajectory_id=trajectory_id, session_key=trajectory.session
        )
        stored = turn_signals.signals_of(conn, trajectory_id)
    messages = conversation(trajectory.calls)
    return {
        **to_export(trajectory),
        "grade": grade,
        "feedback": feedback,
        "messages": messages,
        # how each assistant turn did, by what came right after it (store/next_turn.py):
        # as the learner stored them when it graded (with their keys' weights), else read
        # off the conversation now
        "signals": stored or [s.as_dict() for s in next_turn_signals(messages)],
        "tokens": token_sequences(trajectory),
    }


@router.get(
    "/trajectories/{trajectory_id}",
    summary="One trajectory in full",
    response_model=dict,  # serialised as returned (TrajectoryDetail)
)
async def get_trajectory(
    engine: EngineDep,
    detokenizer: DetokenizerDep,
    trajectory_id: TrajectoryId,
    token_text: Annotated[bool, Query(description="add each token's text (asks vLLM)")] = True,
) -> TrajectoryDetail:
    """The trajectory in the export format plus its grade, feedback, conversation
    (`messages`), next-turn `signals` (per assistant turn, by what came right after it: a
    tool error, an interruption, a word-for-word retry, a correction or an approval; `turn`
    indexes `messages`; once the learner graded it, with the `weight` of its key) and
    token sequences (`tokens`: token_ids, loss_mask, logprobs; the loss
    mask is true on the tokens the learner trains on)."""
    detail = await asyncio.to_thread(_detail, engine, trajectory_id)
    if token_text and detail["tokens"]:
        ids = {t for seq in detail["tokens"] for t in seq["token_ids"]}
        pieces = await detokenizer.pieces_for(ids)
        for seq in detail["tokens"]:
            seq["token_text"] = (
                None if pieces is None else [pieces.get(t) for t in seq["token_ids"]]
            )
    return detail


def _export_lines(engine: Any, ids: list[str]) -> Iterator[bytes]:
    for start in range(0, len(ids), EXPORT_CHUNK):
        for row in iter_trajectories(engine, ids=ids[start : start + EXPORT_CHUNK]):
            yield orjson.dumps(row, option=orjson.OPT_NAIVE_UTC) + b"\n"


@router.get(
    "/export",
    summary="Export trajectories as JSON Lines",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
def export(engine: EngineDep, f: Annotated[TrajectoryFilter, Query()]) -> StreamingResponse:
    """One trajectory per line, oldest first, in the format of `onthejob export`."""
    with engine.connect() as conn:
        ids = trajectory_views.matching_ids(conn, f=f)
    return StreamingResponse(
        _export_lines(engine, ids),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": 'attachment; filename="trajectories.jsonl"'},
    )
