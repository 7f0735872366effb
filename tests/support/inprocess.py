"""The proxy app in the test's own process: `create_app` behind httpx's ASGITransport, its
lifespan (recorder, writer, pollers) run around the test, so the official SDKs talk to it
without a port, a subprocess or a start-up wait. What needs a real socket (keys off
loopback, kills, the CLI) stays with learner/proxy_process.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from starlette.applications import Starlette
from starlette.testclient import TestClient

from proxy.app import create_app, prepare_database
from proxy.settings import Settings

BASE = "http://proxy.test"


@dataclass
class InProcessProxy:
    app: Starlette
    http: httpx.AsyncClient

    def openai(self, session: str | None = None) -> openai.AsyncOpenAI:
        base = f"{BASE}/s/{session}/v1" if session else f"{BASE}/v1"
        return openai.AsyncOpenAI(base_url=base, api_key="x", http_client=self.http, max_retries=0)

    def anthropic(self) -> anthropic.AsyncAnthropic:
        # the anthropic SDK brings its own fork of httpx (httpx2), with the same transport
        http = httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=self.app), base_url=BASE, timeout=30
        )
        return anthropic.AsyncAnthropic(base_url=BASE, api_key="x", http_client=http, max_retries=0)

    def gemini(self, session: str | None = None) -> Any:
        """The google-genai SDK's client (its async side: `.aio`), as Gemini CLI's base URL
        (GOOGLE_GEMINI_BASE_URL) would point it at the proxy."""
        from google import genai
        from google.genai import types

        base = f"{BASE}/s/{session}" if session else BASE
        options = types.HttpOptions(base_url=base, httpx_async_client=self.http)
        return genai.Client(api_key="x", http_options=options)


def _app(settings: dict[str, Any]) -> Starlette:
    config = Settings(**settings)
    prepare_database(config)
    return create_app(config, database_checked=True)


@contextlib.contextmanager
def in_process_client(
    path: str = "", headers: dict[str, str] | None = None, **settings: Any
) -> Iterator[TestClient]:
    """The app on these settings as a synchronous client whose URLs start at `path` (e.g.
    "/admin/api"), sending `headers` with every request; its lifespan ends on leaving."""
    with TestClient(_app(settings), base_url=BASE + path, headers=headers) as client:
        yield client


def wait_for_health(
    client: TestClient, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30
) -> dict[str, Any]:
    """Poll the app's /healthz until predicate(health) holds; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        health = client.get(BASE + "/healthz").json()
        if predicate(health):
            return health
        if time.monotonic() > deadline:
            raise TimeoutError(f"the app never reached: {what}; last health {health}")
        time.sleep(0.05)


@contextlib.asynccontextmanager
async def in_process_proxy(**settings: Any) -> AsyncIterator[InProcessProxy]:
    """The app on these settings (as `onthejob serve` would build them). On leaving, its
    lifespan ends as a stopping proxy's does: every call answered is in the database."""
    app = _app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=30) as http:
            yield InProcessProxy(app, http)
