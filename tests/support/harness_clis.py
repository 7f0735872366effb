"""The real Claude Code, Codex, Gemini and opencode CLIs, unchanged, against a proxy, for tests.

`make clis` installs them at the versions pinned in the Makefile into .tools/clis. Each run
gets its own HOME, config directory and working directory under a temporary directory, so
a test never reads or writes the real home, and an environment in which nothing reaches
the internet: their own telemetry, error reporting and update checks are switched off, and
every other connection goes through a local proxy that refuses it (and notes where it was
going), so a CLI that still tries fails at once instead of hanging.

A missing or wrong-version CLI fails the test, never skips it (CI installs them with
`make setup`); ONTHEJOB_TEST_SKIP_CLIS=1 opts out explicitly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from learner.vllm_server import free_port
from tests.support.paths import ROOT

BIN = ROOT / ".tools" / "clis" / "node_modules" / ".bin"
TIMEOUT_S = 240


def pinned(name: str) -> str:
    """A version the Makefile pins (CLAUDE_CODE_VERSION, CODEX_VERSION, ...)."""
    found = re.search(rf"^{name} := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found is not None, f"{name} is not pinned in the Makefile"
    return found[1]


def cli(name: str, version_name: str) -> Path:
    """The installed CLI, checked to be the pinned version."""
    if os.environ.get("ONTHEJOB_TEST_SKIP_CLIS") == "1":
        pytest.skip("ONTHEJOB_TEST_SKIP_CLIS=1")
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make clis` (make setup and make test do)")
    shown = subprocess.run(
        [str(path), "--version"], capture_output=True, text=True, timeout=60, env=_base_env({})
    )
    version = pinned(version_name)
    assert version in shown.stdout, f"{name} --version says {shown.stdout!r}, pinned {version}"
    return path


class RefusingProxy:
    """An HTTP(S) proxy that refuses every connection and remembers where it was going."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.attempts: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        self.attempts.append(line.decode(errors="replace").strip())
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._refuse, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        server.close()
        self._loop.run_until_complete(server.wait_closed())

    def __enter__(self) -> RefusingProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _base_env(extra: dict[str, str]) -> dict[str, str]:
    # only what a CLI needs: nothing of the test runner's own environment leaks in
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **extra}


@dataclass
class Run:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    workdir: Path
    refused: list[str] = field(default_factory=list)

    def explain(self) -> str:
        return (
            f"$ {' '.join(self.command)}\nexit {self.returncode}\n"
            f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"
        )


def _run(command: list[str], env: dict[str, str], home: Path, workdir: Path) -> Run:
    with RefusingProxy() as outside:
        offline = {
            "HOME": str(home),
            "HTTPS_PROXY": outside.url,
            "HTTP_PROXY": outside.url,
            "https_proxy": outside.url,
            "http_proxy": outside.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        done = subprocess.run(
            command,
            cwd=workdir,
            env=_base_env({**offline, **env}),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        refused = list(outside.attempts)
    return Run(command, done.returncode, done.stdout, done.stderr, workdir, refused)


def _dirs(base: Path) -> tuple[Path, Path]:
    home, workdir = base / "home", base / "work"
    home.mkdir(parents=True)
    workdir.mkdir()
    return home, workdir


def claude_code(base_url: str, model: str, prompt: str, base: Path) -> Run:
    """`claude -p PROMPT` with its base URL at the proxy (all it needs to change)."""
    home, workdir = _dirs(base)
    env = {
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": "unused",
        # the served model for every role Claude Code has
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        # no telemetry, error reports, update checks or other calls home
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    command = [
        str(cli("claude", "CLAUDE_CODE_VERSION")),
        "-p",
        prompt,
        # file edits without asking (the Write tool), nothing else
        "--permission-mode",
        "acceptEdits",
    ]
    return _run(command, env, home, workdir)


CODEX_CONFIG = """\
model = "{model}"
model_provider = "onthejob"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[model_providers.onthejob]
name = "onthejob"
base_url = "{base_url}"
wire_api = "responses"
"""


def codex(base_url: str, model: str, prompt: str, base: Path) -> Run:
    """`codex exec PROMPT` with a `wire_api = "responses"` provider at the proxy."""
    home, workdir = _dirs(base)
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, base_url=base_url))
    command = [
        str(cli("codex", "CODEX_VERSION")),
        "exec",
        "--skip-git-repo-check",
        # the shell tool runs in the working directory without Codex's sandbox, which
        # needs user namespaces that CI containers may not have
        "--dangerously-bypass-approvals-and-sandbox",
        prompt,
    ]
    return _run(command, {"CODEX_HOME": str(codex_home)}, home, workdir)


GEMINI_SETTINGS = {
    # the API key route (GEMINI_API_KEY), not a Google login
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}


def gemini(base_url: str, model: str, prompt: str, base: Path, *, yolo: bool = False) -> Run:
    """`gemini -p PROMPT -m MODEL` with GOOGLE_GEMINI_BASE_URL at the proxy. `yolo`: its
    tools run without asking (else, headless, it offers no tool that writes)."""
    home, workdir = _dirs(base)
    (home / ".gemini").mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    env = {
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_API_KEY": "unused",
        "GEMINI_CLI_TRUST_WORKSPACE": "true",  # headless: no "trust this folder?" prompt
    }
    command = [str(cli("gemini", "GEMINI_CLI_VERSION")), "-p", prompt, "-m", model]
    if yolo:
        command.append("--yolo")
    return _run(command, env, home, workdir)


def opencode(base_url: str, model: str, prompt: str, base: Path) -> Run:
    """`opencode run PROMPT` with an OpenAI-compatible provider at the proxy (its bundled
    @ai-sdk/openai-compatible: nothing is installed at run time)."""
    home, workdir = _dirs(base)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "onthejob": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "onthejob",
                "options": {"baseURL": base_url, "apiKey": "unused"},
                "models": {model: {"name": model}},
            }
        },
        "model": f"onthejob/{model}",
        "autoupdate": False,
        "share": "disabled",
    }
    (workdir / "opencode.json").write_text(json.dumps(config))
    command = [str(cli("opencode", "OPENCODE_VERSION")), "run", prompt, "-m", f"onthejob/{model}"]
    return _run(command, {}, home, workdir)
