"""A TCP forwarder that a test can shut or slow, to make a real server unreachable or slow.

Shut: the listening socket closes (new connections are refused) and open connections are
cut, which is what a client sees when a database host goes away. Slowed (`delay`): every
chunk waits that long before it is passed on, like a database that is falling behind.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from learner.vllm_server import free_port


def through_gate(url: str) -> tuple[str, TcpGate]:
    """The same database URL through a (still shut) gate in front of its server."""
    parts = urlsplit(url)
    gate = TcpGate(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = (
        f"{parts.username}@127.0.0.1:{gate.port}" if parts.username else f"127.0.0.1:{gate.port}"
    )
    return urlunsplit(parts._replace(netloc=netloc)), gate


class TcpGate:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        # seconds each chunk waits before it is passed on (0: at once)
        self.delay = 0.0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.delay:
                    time.sleep(self.delay)  # the slow server being simulated, not a wait
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
