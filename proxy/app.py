"""The proxy's ASGI app: create_app(settings) wires the store, upstream pool and recorder."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from proxy import metrics
from proxy.admin.app import attach, create_admin_app
from proxy.api.routes import anthropic as anthropic_routes
from proxy.api.routes import feedback as feedback_routes
from proxy.api.routes import gemini as gemini_routes
from proxy.api.routes import openai as openai_routes
from proxy.api.routes import responses as responses_routes
from proxy.base.errors import error_body
from proxy.base.keys import KeyRing
from proxy.recording.recorder import Recorder
from proxy.recording.response_store import ResponseStore
from proxy.settings import Settings
from proxy.state import ProxyState
from proxy.upstream.canaries import CanaryTable
from proxy.upstream.gates import GateKeeper
from proxy.upstream.replicas import UpstreamPool
from proxy.upstream.teacher import Teacher
from proxy.upstream.tenants import TenantTable
from store import db, schema
from store.identity import ensure_store_id, public_url

log = logging.getLogger("onthejob.app")


def prepare_database(settings: Settings) -> bool:
    """The store's schema policy (store/schema.py) with the proxy's settings. False when the
    database could not be reached: the writer then checks the schema before its first
    write, and calls wait in the call log."""
    reachable = schema.prepare(
        settings.database_url,
        migrate=settings.migrate,
        auto_migrate=settings.auto_migrate,
        who="proxy",
    )
    if not reachable:
        log.warning("the database is away at start: calls wait in the call log")
    return reachable


def create_app(settings: Settings, *, database_checked: bool | None = None) -> Starlette:
    """The proxy app. Plain Starlette at the root: FastAPI's per-request machinery costs
    measurable latency on the hot path (bench/proxy_overhead.py).

    `database_checked`: what an earlier `prepare_database` returned (`onthejob serve` calls
    it first, to refuse a schema that is behind with a plain message); None: the app's
    start-up does it.
    """

    settings.check_exposure()
    settings.check_teacher()
    admin = create_admin_app()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        schema_checked = database_checked
        if schema_checked is None:
            schema_checked = await asyncio.to_thread(prepare_database, settings)
        engine = db.make_engine(settings.database_url)
        pool = UpstreamPool(
            settings.upstreams,
            connect_timeout=settings.upstream_connect_timeout,
            total_timeout=settings.upstream_timeout,
            retry_after=settings.upstream_retry_after,
            api_key=settings.upstream_api_key,
            gate_wait=settings.gate_wait,
        )
        keys = KeyRing(
            engine, required=settings.keys_required, poll_interval=settings.key_poll_interval
        )
        tenants = TenantTable(engine, pool, poll_interval=settings.key_poll_interval)
        canaries = CanaryTable(engine, pool, poll_interval=settings.key_poll_interval)
        gatekeeper = GateKeeper(
            engine, pool, poll_interval=settings.gate_poll_interval, routes=tenants.routes
        )
        recorder = Recorder(
            engine,
            settings.spool_path,
            idle_timeout=settings.idle_timeout,
            answered_idle_timeout=settings.answered_idle_timeout,
            flush_interval=settings.flush_interval,
            batch_calls=settings.flush_batch_size,
            batch_bytes=settings.flush_batch_bytes,
            fsync_interval=settings.log_fsync_interval,
            segment_bytes=settings.log_segment_bytes,
            check_schema=not schema_checked,
        )
        teacher = Teacher(settings) if settings.teacher_url is not None else None
        await pool.start()
        if teacher is not None:
            await teacher.start()
        # what the replicas serve, and sample with, known before the first call is recorded
        await pool.poll()
        await recorder.start()
        await gatekeeper.start()
        await keys.start()
        await tenants.start()
        await canaries.start()
        watcher = asyncio.create_task(pool.watch(settings.policy_poll_interval))
        gate_follower = asyncio.create_task(gatekeeper.run())
        key_follower = asyncio.create_task(keys.run())
        tenant_follower = asyncio.create_task(tenants.run())
        canary_follower = asyncio.create_task(canaries.run())
        app.state.proxy = ProxyState(
            settings=settings,
            pool=pool,
            recorder=recorder,
            responses=ResponseStore(engine),
            keys=keys,
            tenants=tenants,
            canaries=canaries,
            teacher=teacher,
            store={"id": None, "url": public_url(settings.database_url)},
        )
        await _learn_store_id(app.state.proxy, engine)
        attach(admin, app.state.proxy)
        _tune_gc()
        try:
            yield
        finally:
            for task in (watcher, gate_follower, key_follower, tenant_follower, canary_follower):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await gatekeeper.stop()
            await recorder.close()
            await pool.close()
            if teacher is not None:
                await teacher.close()
            engine.dispose()

    request_stats = metrics.RequestStats()
    app = Starlette(
        # Starlette tries routes in order, a regex match each (~0.45 us): the generation
        # routes first (chat completions reached after 13 misses cost ~5 us a call), the
        # /v1/* passthrough last
        routes=[
            *openai_routes.generation_routes(),
            *anthropic_routes.routes(),
            *gemini_routes.routes(),
            *responses_routes.routes(),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics.endpoint, methods=["GET"]),
            Mount("/admin", app=admin),
            *feedback_routes.routes(),
            *openai_routes.passthrough_routes(),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _unexpected_error},
        middleware=[metrics.middleware(request_stats)],
        lifespan=lifespan,
    )
    app.state.request_stats = request_stats
    return app


def _tune_gc() -> None:
    """Keep start-up objects out of the collector and collect young objects less often.

    Full collections over the ~100k objects that imports leave behind paused the event
    loop for 60-110 ms at a time under load (bench/proxy_overhead.py). What outlives a call
    is little (its trajectory's state, two objects) and the hot path makes no reference
    cycles, so a young generation of 100k allocations is collected every ~45k calls in
    ~30 ms: at c=32, 0.03 s of collection in 10 s of load against 0.17 s with 10k, and a
    lower p99 (15-16 ms against 19).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 20, 20)


_store_lookups: set[asyncio.Task[None]] = set()


async def _learn_store_id(state: ProxyState, engine: Engine) -> None:
    """The store's id, once the store answers (a store that is away: asked again later)."""
    if state.store["id"] is not None:
        return

    def read() -> str:
        with engine.begin() as conn:
            return ensure_store_id(conn)

    try:
        state.store["id"] = await asyncio.to_thread(read)
    except SQLAlchemyError:
        log.debug("store id not readable yet", exc_info=True)


async def healthz(request: Request) -> Response:
    """Liveness plus what an operator wants first: upstream health and the write backlog
    (`backlog_*`: answered calls in the call log, not yet in the database; `queue_*`: the
    batch the writer holds in memory, and its bound), and which store it records to."""
    state: ProxyState = request.app.state.proxy
    if state.store["id"] is None and not _store_lookups:
        # the store was away at start: look again in the background, never on this answer
        lookup = asyncio.create_task(_learn_store_id(state, state.recorder.engine))
        _store_lookups.add(lookup)
        lookup.add_done_callback(_store_lookups.discard)
    return JSONResponse(
        {
            "status": "ok",
            "upstreams": [
                {
                    "url": r.url,
                    "healthy": r.healthy,
                    "policy_version": r.policy_version,
                    # the LoRA adapters it has loaded, as last read (tenants' calls go to theirs)
                    "adapters": sorted(r.adapters),
                    "gated": r.gate_epoch is not None,
                    # what it samples with where a request sets nothing (null: unknown)
                    "sampling_defaults": r.sampling_defaults,
                }
                for r in state.pool.replicas
            ],
            # the teacher (`serve --teacher-url`): where, which model, whether it answers
            "teacher": None
            if state.teacher is None
            else {
                "url": state.teacher.replica.url,
                "model": state.teacher.model,
                "healthy": state.teacher.replica.healthy,
            },
            "recording": state.recorder.status(),
            # which store: a runner checks it records where this proxy does
            "store": state.store,
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
