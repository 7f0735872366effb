"""The proxy's ASGI app: create_app(settings) wires the store, upstream pool and recorder."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from proxy import metrics
from proxy.admin.app import attach, create_admin_app
from proxy.errors import error_body
from proxy.recording import Recorder
from proxy.response_store import ResponseStore
from proxy.routes import anthropic as anthropic_routes
from proxy.routes import feedback as feedback_routes
from proxy.routes import openai as openai_routes
from proxy.routes import responses as responses_routes
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


def create_app(settings: Settings) -> Starlette:
    """The proxy app. Plain Starlette at the root: FastAPI's per-request machinery costs
    measurable latency on the hot path (bench/proxy_overhead.py)."""

    settings.check_exposure()
    admin = create_admin_app()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
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
        app.state.proxy = ProxyState(
            settings=settings, pool=pool, recorder=recorder, responses=ResponseStore(engine)
        )
        attach(admin, app.state.proxy)
        _tune_gc()
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await recorder.close()
            await pool.close()
            engine.dispose()

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics.endpoint, methods=["GET"]),
            Mount("/admin", app=admin),
            # specific routes first: openai_routes ends with the /v1/* passthrough
            *feedback_routes.routes(),
            *anthropic_routes.routes(),
            *responses_routes.routes(),
            *openai_routes.routes(),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
        middleware=[metrics.middleware()],
        lifespan=lifespan,
    )


def _tune_gc() -> None:
    """Keep start-up objects out of the collector and collect young objects less often.

    Full collections over the ~100k objects that imports leave behind paused the event
    loop for 60-110 ms at a time under load (bench/proxy_overhead.py).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


async def healthz(request: Request) -> Response:
    """Liveness plus what an operator wants first: upstream health and the write backlog."""
    state: ProxyState = request.app.state.proxy
    return JSONResponse(
        {
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
                "rejected": state.recorder.rejected,
            },
        }
    )


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
