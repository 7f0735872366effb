"""A small HTTP/1.1 client for the calls the proxy makes to its upstreams on a client's
behalf: kept-alive connections per upstream, one total timeout per request, bodies read
whole or streamed as they arrive.

Why not aiohttp's client: on this machine it cost ~60 us of CPU per request
(ClientSession._request, ClientRequest, ClientResponse), a third of the proxy's whole budget
per call; this costs ~10 us (bench/proxy_overhead.py, issue 16). aiohttp still does the
proxy's own low-rate calls (policy polls, sampling defaults, /health).

The exceptions raised are aiohttp's (subclasses of them), so every caller's handling of an
upstream failure stays as it was: `ConnectError` (refused, unresolvable: the replica is
down), `aiohttp.ConnectionTimeoutError`, `Disconnected` (a `ServerDisconnectedError`: the
connection dropped before or during the response), `TimeoutError` (the total timeout), and
`InvalidResponse` (an `aiohttp.ClientError`: an answer that is not HTTP).

Invariant: a connection carries one request at a time and goes back to the idle list only
after its response was read to the end and the server keeps it alive; anything else
(a response released early, an error, a cancelled caller) closes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import quote, urlsplit

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

# a streamed body past this much unread pauses reading from the upstream until it drains
_HIGH_WATER = 1 << 20
_BODYLESS_METHODS = {"GET", "DELETE", "HEAD", "OPTIONS"}
# what may stand in a request line as it is; anything else (spaces, controls, non-ASCII) is
# percent-encoded, so no path can split the request line
_PATH_SAFE = "/?#[]@!$&'()*+,;=:%-._~"


class ConnectError(aiohttp.ClientOSError):
    """The upstream could not be connected to (refused, unresolvable, unreachable)."""


class Disconnected(aiohttp.ServerDisconnectedError):
    """The upstream closed the connection before its response ended."""


class InvalidResponse(aiohttp.ClientError):
    """The upstream's answer is not HTTP/1.1 we can read, or a request header is unsafe."""


class _Origin:
    """scheme://host:port of an upstream URL, and the path prefix its routes sit under."""

    __slots__ = ("base_path", "host", "host_header", "key", "port", "ssl")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.ssl = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.ssl else 80)
        self.key = (parts.scheme, self.host, self.port)
        netloc = parts.netloc.rpartition("@")[2]
        self.host_header = netloc.encode("idna" if not netloc.isascii() else "ascii")
        self.base_path = parts.path.rstrip("/")


class _Connection(asyncio.Protocol):
    """One TCP connection and the response being read on it (httptools parses)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None or response.complete:
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(InvalidResponse(f"invalid HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is None or response.complete:
            return
        if response.until_eof:  # neither a length nor chunks: the close ends the body
            response.finish()
        else:
            response.fail(Disconnected(f"upstream closed the connection: {exc or 'EOF'}"))

    def pause_writing(self) -> None:  # request bodies are small: nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status = self.parser.get_status_code()
        # asked here: once the message is complete the parser has reset for the next one
        response.keep_alive = self.parser.should_keep_alive()
        response.headers_done()

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response.feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response.finish()

    # -- the client's side ---------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()


class BodyReader:
    """`response.content`: aiohttp's `iter_any()`, the one way the proxy streams a body."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    async def iter_any(self) -> AsyncIterator[bytes]:
        response = self._response
        while True:
            piece = await response.next_piece()
            if not piece:
                return
            yield piece


class Response:
    """What aiohttp's ClientResponse gave the proxy: status, headers, read(), content,
    release()."""

    def __init__(self, client: Client, conn: _Connection, origin: _Origin) -> None:
        self._client = client
        self._conn = conn
        self._origin = origin
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._headers: CIMultiDictProxy[str] | None = None
        self.until_eof = False
        self.keep_alive = False
        self.complete = False
        self.released = False
        self.error: BaseException | None = None
        self._pieces: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self.head: asyncio.Future[None] = client.loop.create_future()
        self.timer: asyncio.TimerHandle | None = None

    @property
    def content(self) -> BodyReader:
        # made when asked, never kept: a reader stored here would make each response a
        # reference cycle, freed only by the garbage collector (10k of them at a time,
        # 50 ms pauses at c=32)
        return BodyReader(self)

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        if self._headers is None:
            self._headers = CIMultiDictProxy(
                CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers)
            )
        return self._headers

    # -- fed by the connection -----------------------------------------------------------
    def headers_done(self) -> None:
        if self.status >= 200 and self.status not in (204, 304):
            names = {name.lower() for name, _ in self.raw_headers}
            self.until_eof = b"content-length" not in names and b"transfer-encoding" not in names
        if not self.head.done():
            self.head.set_result(None)

    def feed(self, body: bytes) -> None:
        self._pieces.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER:
            self._conn.pause()
        self._wake()

    def finish(self) -> None:
        if self.complete:
            return
        self.complete = True
        self._cancel_timer()
        if not self.head.done():  # a 1xx/204-like answer with nothing after its head
            self.head.set_result(None)
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if self.complete:
            return
        self.complete = True
        self.error = exc
        self._cancel_timer()
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved: a caller gone by now must not be warned about
        self._wake()

    def timed_out(self) -> None:
        self.timer = None
        self.fail(TimeoutError(f"upstream {self._origin.host}:{self._origin.port} timed out"))
        self._conn.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- the caller's side ---------------------------------------------------------------
    async def next_piece(self) -> bytes:
        """The next piece of the body; b"" at its end. Raises what broke it off."""
        while not self._pieces:
            if self.complete:
                if self.error is not None:
                    raise self.error
                return b""
            self._waiter = self._client.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        piece = self._pieces.popleft()
        self._buffered -= len(piece)
        if self._buffered <= _HIGH_WATER // 2:
            self._conn.resume()
        return piece

    async def read(self) -> bytes:
        """The whole body. Raises what broke it off."""
        pieces = []
        while piece := await self.next_piece():
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def release(self) -> None:
        """Done with it: the connection is kept for the next request if the body was read
        to its end and the server keeps it alive, otherwise closed."""
        if self.released:
            return
        self.released = True
        self._cancel_timer()
        conn = self._conn
        reusable = (
            self.complete
            and self.error is None
            and not self._pieces
            and not self.until_eof
            and not conn.closed
            and self.keep_alive
        )
        conn.response = None
        if reusable:
            self._client.put_back(self._origin, conn)
        else:
            conn.close()

    def close(self) -> None:
        self.release()


class Client:
    """Kept-alive connections per upstream origin, most recently used first."""

    def __init__(self, *, connect_timeout: float, total_timeout: float, keepalive: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.total_timeout = total_timeout
        self.keepalive = keepalive
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self, method: str, url: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        """Send `method path` to the upstream at `url` (path as given: no normalisation);
        the response once its head has arrived. The caller must release it."""
        origin = self._origins.get(url)
        if origin is None:
            origin = self._origins[url] = _Origin(url)
        head = _request_head(method, origin, path, body, headers)
        deadline = self.loop.time() + self.total_timeout
        conn = self._take(origin) or await self._connect(origin, deadline)
        response = Response(self, conn, origin)
        conn.response = response
        response.timer = self.loop.call_at(deadline, response.timed_out)
        assert conn.transport is not None
        if body:
            conn.transport.writelines((head, body))
        else:
            conn.transport.write(head)
        try:
            await response.head
        except BaseException:
            response.release()  # closes it: nothing read to the end
            raise
        return response

    def put_back(self, origin: _Origin, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(origin.key, []).append(conn)

    def _take(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin.key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                return conn
            conn.close()  # the server may be closing it: a fresh one instead
        return None

    async def _connect(self, origin: _Origin, deadline: float) -> _Connection:
        context = None
        if origin.ssl:
            context = self._ssl = self._ssl or ssl.create_default_context()
        limit = min(self.connect_timeout, max(0.0, deadline - self.loop.time()))
        try:
            async with asyncio.timeout(limit):
                _, conn = await self.loop.create_connection(
                    _Connection,
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context else None,
                )
        except TimeoutError as exc:
            raise aiohttp.ConnectionTimeoutError(
                f"connecting to {origin.host}:{origin.port} timed out"
            ) from exc
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {reason}") from exc
        return conn

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)  # let the transports finish closing


def _request_head(
    method: str, origin: _Origin, path: str, body: bytes | None, headers: Mapping[str, str]
) -> bytes:
    target = origin.base_path + path
    if not target.isascii() or not target.isprintable() or " " in target:
        target = quote(target, safe=_PATH_SAFE)
    lines = [
        f"{method} {target} HTTP/1.1\r\n".encode("ascii"),
        b"Host: " + origin.host_header + b"\r\n",
    ]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise InvalidResponse(f"request header {name!r} is not safe to send")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if body or method not in _BODYLESS_METHODS:
        lines.append(b"Content-Length: %d\r\n" % len(body or b""))
    lines.append(b"\r\n")
    return b"".join(lines)
