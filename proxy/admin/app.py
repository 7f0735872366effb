"""The admin sub-application: the JSON API under /api (behind the bearer token) and the
dashboard, a static page that logs in with the same token."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles

from proxy.admin import errors
from proxy.admin.deps import require_token
from proxy.admin.routes import (
    canaries,
    compat,
    curricula,
    feedback,
    guard,
    interaction_types,
    keys,
    learner,
    selfjudge,
    signals,
    stats,
    tasks,
    tenants,
    trajectories,
    versions,
    watch,
)
from proxy.admin.tokens import Detokenizer
from proxy.state import ProxyState

STATIC = Path(__file__).parent / "static"
# the dashboard shows recorded (untrusted) text: no inline script, nothing from elsewhere
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

_AUTH_RESPONSES = {
    400: {"description": "invalid input; the message names the field"},
    401: {"description": "missing or wrong bearer token"},
    403: {"description": "the admin API is disabled (no ONTHEJOB_ADMIN_TOKEN)"},
}


def create_admin_app() -> FastAPI:
    app = FastAPI(
        title="onthejob admin API",
        summary="See and steer what the system learns: trajectories, rewards, tasks, "
        "policy versions, the learner, statistics, export, curricula, the self-judge's "
        "agreement, the regression guard, the client keys that may use the model, and the "
        "tenants whose calls LoRA adapters of their own answer, and the canaries that try a new "
        "version on a share of the traffic.",
        version="1",
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
    )
    api = APIRouter(prefix="/api", dependencies=[Depends(require_token)], responses=_AUTH_RESPONSES)
    modules = (
        trajectories,
        feedback,
        tasks,
        versions,
        learner,
        stats,
        compat,
        keys,
        curricula,
        interaction_types,
        selfjudge,
        guard,
        signals,
        tenants,
        canaries,
        watch,
    )
    for module in modules:
        api.include_router(module.router)
    app.include_router(api)
    errors.install(app)

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=_page_headers())

    @app.get("/api", include_in_schema=False)
    def api_root() -> RedirectResponse:
        return RedirectResponse("api/docs")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def _security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    return app


def _page_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }


def attach(app: FastAPI, state: ProxyState) -> None:
    """Give the admin app the running proxy's state (a mounted app gets no lifespan)."""
    app.state.proxy = state
    app.state.detokenizer = Detokenizer(state.pool, state.settings.tokenizer)
