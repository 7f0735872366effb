"""`POST /v1/onthejob/feedback`: rewards from the harness owner or an end user.

Protected by a bearer token (ONTHEJOB_FEEDBACK_TOKEN, else ONTHEJOB_ADMIN_TOKEN); without
one configured the route is off. The feedback grader of `onthejob learn` reads these.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from typing import TypedDict

from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy.base.errors import (
    BadRequest,
    Forbidden,
    ProxyError,
    ServiceUnavailable,
    Unauthorized,
    error_response,
)
from proxy.base.requests import parse_object, read_body
from proxy.state import ProxyState
from store.feedback import add_feedback
from store.json_types import JsonObject


class Feedback(TypedDict):
    """A checked feedback request: `add_feedback`'s arguments, and what the reply echoes."""

    reward: float
    trajectory_id: str | None
    session_key: str | None
    comment: str | None


def _check_token(request: Request, expected: str | None) -> None:
    if not expected:
        raise Forbidden("feedback is disabled: set ONTHEJOB_FEEDBACK_TOKEN on the proxy")
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("missing or wrong bearer token for feedback")


def _parse(body: JsonObject, session: str | None) -> Feedback:
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise BadRequest("'reward' must be a finite number", param="reward")
    trajectory_id = body.get("trajectory_id")
    session = body.get("session", session)
    if trajectory_id is None and session is None:
        raise BadRequest("give 'trajectory_id' or 'session'", param="trajectory_id")
    for name, value in (("trajectory_id", trajectory_id), ("session", session)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 200):
            raise BadRequest(f"'{name}' must be a non-empty string", param=name)
    comment = body.get("comment")
    if comment is not None and not isinstance(comment, str):
        raise BadRequest("'comment' must be a string", param="comment")
    return {
        "reward": float(reward),
        "trajectory_id": trajectory_id,
        "session_key": session,
        "comment": comment,
    }


async def post_feedback(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    try:
        _check_token(request, state.settings.feedback_token or state.settings.admin_token)
        body = parse_object(await read_body(request, 1024 * 1024))
        feedback = _parse(body, request.path_params.get("session"))
    except ProxyError as exc:
        return error_response(exc)

    def write() -> None:
        with state.recorder.engine.begin() as conn:
            add_feedback(conn, **feedback)

    try:
        await asyncio.to_thread(write)
    except SQLAlchemyError:
        return error_response(ServiceUnavailable("the database is unreachable; retry later"))
    return JSONResponse({"ok": True, **feedback}, status_code=201)


def routes() -> list[BaseRoute]:
    return [
        Route(prefix + "/v1/onthejob/feedback", post_feedback, methods=["POST"])
        for prefix in ("", "/s/{session}")
    ]
