"""Run `onthejob serve` as a real subprocess on a free port: for the tests, the benches and
anything else that drives the proxy from outside, as `learner/vllm_server.py` does vLLM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from learner.vllm_server import free_port
from store.json_types import JsonObject


class ProxyServer:
    def __init__(
        self,
        upstreams: list[str],
        *,
        db_url: str,
        spool: Path,
        log_path: Path,
        args: list[str] | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
        settings_from_environment: bool = True,
    ) -> None:
        inherited = {**os.environ}
        if not settings_from_environment:
            # no ONTHEJOB_* setting of this process's environment reaches the proxy (a bench
            # of the defaults runs it on its defaults whatever the shell exported)
            for key in [k for k in inherited if k.startswith("ONTHEJOB_")]:
                del inherited[key]
        # a proxy stuck in its start dumps every thread's stack on SIGABRT (see start)
        self.env = {**inherited, "PYTHONFAULTHANDLER": "1", **(env or {})}
        self.upstreams = upstreams
        self.db_url = db_url
        self.spool = spool
        self.log_path = log_path
        self.args = list(args or [])
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "cli", "--log-level", "info", "serve"]
        for upstream in self.upstreams:
            cmd += ["--upstream", upstream]
        cmd += ["--port", str(self.port), "--db", self.db_url, "--spool", str(self.spool)]
        return cmd + self.args

    def start(self, timeout: float = 120.0) -> ProxyServer:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited during start-up:\n{self.log_tail()}")
            try:
                self.health()
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        # where it is stuck: Python's fault handler writes the stacks into its log
        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        raise TimeoutError(f"proxy not up after {timeout}s:\n{self.log_tail()}")

    def health(self) -> JsonObject:
        with urllib.request.urlopen(self.url + "/healthz", timeout=5) as response:
            return json.loads(response.read())

    def wait_for(self, predicate: Any, what: str, timeout: float = 30.0) -> JsonObject:
        """Poll /healthz until predicate(health) holds; bounded."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            if predicate(health):
                return health
            if time.monotonic() > deadline:
                raise TimeoutError(f"proxy never reached: {what}; last health {health}")
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> int | None:
        """Graceful stop (SIGTERM): the proxy flushes its queue before it exits."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
