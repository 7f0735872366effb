"""Errors of the admin API, answered in the proxy's (OpenAI) error shape.

Validation failures are 400 with every bad field named; a database that is away is 503;
anything unexpected is logged and still answered in the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.exceptions import HTTPException

from proxy.base.errors import error_body

log = logging.getLogger("onthejob.admin")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    502: "upstream_error",
    503: "server_error",
}


class AdminError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def not_found(what: str, key: str) -> AdminError:
    return AdminError(404, f"no {what} {key!r}")


def _answer(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse(error_body(message, kind, param=param), status_code=status)


def _where(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or str(loc[0] if loc else "request")


async def _admin_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AdminError)
    return _answer(exc.status, exc.message, exc.param)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [f"{_where(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()]
    first = exc.errors()[0] if exc.errors() else {}
    param = _where(tuple(first.get("loc", ()))) if first else None
    return _answer(400, "invalid request: " + "; ".join(problems), param)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return _answer(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    # DBAPIError subclasses for bad data (DataError) are input mistakes that slipped past
    # validation; an unreachable or failing database is a 503 the client may retry
    if isinstance(exc, DBAPIError) and type(exc).__name__ == "DataError":
        log.warning("data error on %s %s: %s", request.method, request.url.path, exc.orig)
        return _answer(400, "the database refused a value in this request")
    log.error("database error on %s %s: %s", request.method, request.url.path, exc)
    return _answer(503, "the database is unreachable or failing; retry later")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled admin error on %s %s", request.method, request.url.path, exc_info=exc)
    return _answer(500, "internal admin error; see the proxy log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(AdminError, _admin_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(SQLAlchemyError, _database_error)
    app.add_exception_handler(Exception, _unexpected)
