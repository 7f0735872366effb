"""The proxy's ASGI app: create_app(settings) wires the store, upstream pool and recorder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import error_body
from proxy.recording import Recorder
from proxy.routes import openai as openai_routes
from proxy.settings import Settings
from proxy.spool import Spool
from proxy.state import ProxyState
from proxy.store import db
from proxy.upstream import UpstreamPool

log = logging.getLogger("onthejob.app")


def prepare_database(settings: Settings) -> None:
    """SQLite is upgraded on start; a server database is only checked (`onthejob db upgrade`)."""
    url = settings.database_url
    try:
        if settings.auto_migrate and db.normalise_url(url).startswith("sqlite"):
            db.upgrade(url)
            return
        current = db.current_revision(url)
        head = db.head_revision()
        if current != head:
            log.warning(
                "database schema is at %s, code expects %s: run `onthejob db upgrade --db ...`",
                current,
                head,
            )
    except SQLAlchemyError as exc:
        # records are spooled until it is reachable; starting must not depend on it
        log.warning("database unreachable at start (%s); recording to the spool", exc)


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(prepare_database, settings)
        engine = db.make_engine(settings.database_url)
        pool = UpstreamPool(
            settings.upstreams,
            connect_timeout=settings.upstream_connect_timeout,
            total_timeout=settings.upstream_timeout,
            retry_after=settings.upstream_retry_after,
            api_key=settings.upstream_api_key,
        )
        recorder = Recorder(
            engine,
            Spool(settings.spool_path),
            idle_timeout=settings.idle_timeout,
            flush_interval=settings.flush_interval,
            batch_size=settings.flush_batch_size,
        )
        await pool.start()
        await recorder.start()
        watcher = asyncio.create_task(pool.watch(settings.policy_poll_interval))
        app.state.proxy = ProxyState(settings=settings, pool=pool, recorder=recorder)
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await recorder.close()
            await pool.close()
            engine.dispose()

    app = FastAPI(
        title="onthejob proxy",
        description="OpenAI-compatible recording proxy in front of vLLM.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.router.routes.extend(openai_routes.routes())
    app.add_api_route("/healthz", healthz, methods=["GET"], tags=["ops"])
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    return app


async def healthz(request: Request) -> dict[str, Any]:
    """Liveness plus what an operator wants first: upstream health and the write backlog."""
    state: ProxyState = request.app.state.proxy
    return {
        "status": "ok",
        "upstreams": [
            {"url": r.url, "healthy": r.healthy, "policy_version": r.policy_version}
            for r in state.pool.replicas
        ],
        "recording": {
            "queue_depth": state.recorder.queue_depth,
            "spool_bytes": state.recorder.spool.size(),
            "written": state.recorder.written,
            "spooled": state.recorder.spooled,
        },
    }


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(f"{request.method} {request.url.path}: {exc.detail}", kind),
        status_code=exc.status_code,
    )


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(
        error_body("internal proxy error; see the proxy log", "server_error"), status_code=500
    )
