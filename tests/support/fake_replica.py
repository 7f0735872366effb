"""bench/fake_upstream's constant-answer server as a replica a test can take down and bring
back on the same address.

Down: the listening socket closes (new connections are refused) and open connections are
cut, as when a vLLM replica dies; up: it listens again on the same port.
"""

from __future__ import annotations

import asyncio
import threading

from bench.fake_upstream import handle, models_with
from learner.vllm_server import free_port


class FakeReplica:
    def __init__(self) -> None:
        # the LoRA adapters its /v1/models lists (a test loads and unloads them), and every
        # chat completion request it was sent
        self.adapters: list[str] = []
        self.asked: list[dict] = []
        # set: /v1/models answers this error instead (status line, body)
        self.models_error: tuple[str, bytes] | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            await handle(reader, writer, models=self._models, asked=self.asked)
        finally:
            self._open.discard(writer)

    def _models(self) -> bytes | tuple[str, bytes]:
        return self.models_error or models_with(self.adapters)

    async def _up(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )

    async def _down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._open):
            writer.transport.abort()
        if server is not None:
            await server.wait_closed()

    def up(self) -> None:
        asyncio.run_coroutine_threadsafe(self._up(), self._loop).result(10)

    def down(self) -> None:
        asyncio.run_coroutine_threadsafe(self._down(), self._loop).result(10)

    def __enter__(self) -> FakeReplica:
        self._thread.start()
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
