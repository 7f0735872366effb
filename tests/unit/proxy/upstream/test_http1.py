"""proxy.upstream.http1: the upstream client, against raw asyncio servers that answer as scripted.

Each test's server is a coroutine given the connection's reader and writer, so what goes
over the wire (and when) is exact: chunk by chunk, closes mid-answer, answers never sent.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from proxy.upstream import http1
from proxy.upstream.replicas import _failure

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class Server:
    """One scripted answer per connection; records the requests' heads and connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed = asyncio.Event()  # a connection of ours saw the client hang up
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.url = ""

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # their handlers see the end and finish
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        try:
            await self.handler(self, reader, writer)
            if not await reader.read(1):  # the client hung up (or sent no more)
                self.closed.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed.set()
        finally:
            writer.close()

    async def head(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request (head and Content-Length body)."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                await reader.readexactly(int(line.split(b":")[1]))
        return head


def answering_ok(times: int) -> Handler:
    """A server that reads `times` requests on its connection and answers each with OK."""

    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for _ in range(times):
            await server.head(reader)
            writer.write(OK)

    return handler


def client(total: float = 10.0) -> http1.Client:
    return http1.Client(connect_timeout=2.0, total_timeout=total, keepalive=4.0)


async def post(c: http1.Client, url: str, path: str = "/v1/chat/completions") -> http1.Response:
    return await c.request(
        "POST", url, path, body=b'{"a": 1}', headers={"Content-Type": "application/json"}
    )


def test_a_whole_answer_is_read_and_its_connection_kept_for_the_next_request() -> None:
    handler = answering_ok(3)

    async def run(server: Server) -> None:
        c = client()
        for _ in range(3):
            response = await post(c, server.url)
            assert response.status == 200
            assert response.headers["content-type"] == "application/json"
            assert await response.read() == b"{}"
            response.release()
        await c.close()

    async def main() -> None:
        async with Server(handler) as server:
            await run(server)
        assert server.connections == 1
        assert server.heads[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nContent-Length: 8\r\n" in server.heads[0]
        assert b"\r\nHost: 127.0.0.1:" in server.heads[0]

    asyncio.run(main())


def test_a_chunked_stream_arrives_piece_by_piece_as_the_upstream_sends_it() -> None:
    sent_first = asyncio.Event()
    read_first = asyncio.Event()

    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        sent_first.set()
        await read_first.wait()  # the next piece only once the client has the first
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            response = await post(c, server.url)
            pieces = []
            async for piece in response.content.iter_any():
                pieces.append(piece)
                read_first.set()
            response.release()
            await c.close()
        assert b"".join(pieces) == b"firstsecond" and pieces[0] == b"first"

    asyncio.run(main())


def test_connection_close_and_an_early_release_are_not_reused() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        if server.connections == 1:
            writer.write(OK.replace(b"OK\r\n", b"OK\r\nConnection: close\r\n", 1))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")  # 5 of 10
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            response = await post(c, server.url)
            assert await response.read() == b"{}"
            response.release()
            response = await post(c, server.url)  # a new connection: the first was closed
            response.release()  # before its body ended: closed too
            await server.closed.wait()
            await c.close()
        assert server.connections == 2

    asyncio.run(main())


def test_a_body_without_length_ends_when_the_upstream_closes() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            response = await post(c, server.url)
            assert await response.read() == b"all of it"
            response.release()
            await c.close()

    asyncio.run(main())


def test_a_close_before_the_answer_or_in_its_middle_is_a_server_disconnect() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        if server.connections == 2:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.")
            await writer.drain()
        writer.transport.abort()

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            with pytest.raises(aiohttp.ServerDisconnectedError) as before:
                await post(c, server.url)
            response = await post(c, server.url)
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await response.read()
            response.release()
            await c.close()
        assert _failure(before.value).startswith("dropped the connection")

    asyncio.run(main())


def test_a_refused_connection_is_a_connect_error() -> None:
    async def main() -> None:
        async with Server(lambda s, r, w: asyncio.sleep(0)) as server:
            url = server.url
        c = client()  # the server is gone: its port refuses
        with pytest.raises(aiohttp.ClientOSError) as refused:
            await post(c, url)
        await c.close()
        assert isinstance(refused.value, http1.ConnectError)
        assert _failure(refused.value).startswith("connect: cannot connect to 127.0.0.1:")

    asyncio.run(main())


def test_an_answer_that_never_comes_times_out_and_its_connection_is_closed() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)  # and no answer

    async def main() -> None:
        async with Server(handler) as server:
            c = client(total=0.2)
            with pytest.raises(TimeoutError):
                await post(c, server.url)
            await server.closed.wait()
            await c.close()

    asyncio.run(main())


def test_a_caller_cancelled_while_waiting_closes_the_connection() -> None:
    asked = asyncio.Event()

    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        asked.set()

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            waiting = asyncio.ensure_future(post(c, server.url))
            await asked.wait()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await server.closed.wait()
            await c.close()

    asyncio.run(main())


def test_unsafe_headers_are_refused_and_odd_paths_are_percent_encoded() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        writer.write(OK)

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            with pytest.raises(aiohttp.ClientError, match="not safe"):
                await c.request(
                    "GET", server.url, "/v1/models", body=None, headers={"X": "a\r\nEvil: 1"}
                )
            response = await c.request("GET", server.url, "/v1/a b/é", body=None, headers={})
            assert await response.read() == b"{}"
            response.release()
            await c.close()
        assert server.heads == [
            b"GET /v1/a%20b/%C3%A9 HTTP/1.1\r\nHost: " + server.url[7:].encode() + b"\r\n\r\n"
        ]

    asyncio.run(main())


def test_an_invalid_answer_is_a_client_error() -> None:
    async def handler(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.head(reader)
        writer.write(b"this is not HTTP\r\n\r\n")

    async def main() -> None:
        async with Server(handler) as server:
            c = client()
            with pytest.raises(aiohttp.ClientError, match="invalid HTTP response"):
                await post(c, server.url)
            await c.close()

    asyncio.run(main())


def test_a_released_response_is_freed_at_once_without_the_garbage_collector() -> None:
    """A response read whole or streamed holds no reference cycle: at c=32 each one left to
    the collector piled up by the ten thousand and cost 50 ms pauses to collect."""

    handler = answering_ok(2)

    async def main() -> list[weakref.ref[http1.Response]]:
        refs = []
        async with Server(handler) as server:
            c = client()
            whole = await post(c, server.url)
            assert await whole.read() == b"{}"
            whole.release()
            streamed = await post(c, server.url)
            assert [piece async for piece in streamed.content.iter_any()] == [b"{}"]
            streamed.release()
            refs = [weakref.ref(whole), weakref.ref(streamed)]
            del whole, streamed
            await c.close()
        return refs

    gc.disable()
    try:
        refs = asyncio.run(main())
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
