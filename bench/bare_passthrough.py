"""The reference the proxy's budget is measured against: a bare Starlette + aiohttp
passthrough with no recording, no parsing and no translation (it reached 9,073 req/s at c=32
on a 2-core host of the project's kind, where the proxy's aim of 5,000 came from).
bench/proxy_overhead.py runs it beside the proxy on the same CPUs, so proxy/bare is a ratio
taken in one run, whatever the host's speed.

Run: python -m bench.bare_passthrough --upstream http://127.0.0.1:9000 --port 9100
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app(upstream: str) -> Starlette:
    session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nonlocal session
        session = aiohttp.ClientSession(base_url=upstream, connector=aiohttp.TCPConnector(limit=0))
        try:
            yield
        finally:
            await session.close()

    async def forward(request: Request) -> Response:
        assert session is not None
        body = await request.body()
        async with session.post(
            request.url.path, data=body, headers={"content-type": "application/json"}
        ) as upstream_response:
            content = await upstream_response.read()
            return Response(
                content,
                status_code=upstream_response.status,
                media_type=upstream_response.content_type,
            )

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", forward, methods=["POST"]),
            Route("/healthz", health),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_passthrough")
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:9000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        build_app(args.upstream),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
