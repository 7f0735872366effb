"""A small aiohttp upstream on its own thread and event loop, for tests that need an upstream
to misbehave on demand. Subclasses add their routes; `with` starts and stops it."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web

from learner.vllm_server import free_port


class ThreadedUpstream:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            app = web.Application()
            self.add_routes(app)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self._loop.run_until_complete(serve())

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
