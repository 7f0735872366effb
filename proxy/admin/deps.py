"""Request dependencies of the admin API: the proxy's state, the engine, the bearer check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from proxy.admin.errors import AdminError
from proxy.admin.tokens import Detokenizer
from proxy.state import ProxyState

_bearer = HTTPBearer(auto_error=False, description="ONTHEJOB_ADMIN_TOKEN")


def get_state(request: Request) -> ProxyState:
    return request.app.state.proxy


def get_engine(state: Annotated[ProxyState, Depends(get_state)]) -> Engine:
    return state.recorder.engine


def get_detokenizer(request: Request) -> Detokenizer:
    return request.app.state.detokenizer


def require_token(
    state: Annotated[ProxyState, Depends(get_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    expected = state.settings.admin_token
    if not expected:
        raise AdminError(403, "the admin API is disabled: set ONTHEJOB_ADMIN_TOKEN on the proxy")
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AdminError(401, "missing or wrong bearer token (Authorization: Bearer <token>)")


StateDep = Annotated[ProxyState, Depends(get_state)]
EngineDep = Annotated[Engine, Depends(get_engine)]
DetokenizerDep = Annotated[Detokenizer, Depends(get_detokenizer)]
