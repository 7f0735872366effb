"""Starting one harness run: a fresh working directory, the environment, a bounded process.

The harness is a black box: a command. It gets the proxy under the run's session key in
OPENAI_BASE_URL / OPENAI_API_BASE / ANTHROPIC_BASE_URL, the prompt as `{prompt}` in its
arguments, on stdin and as ONTHEJOB_PROMPT. Invariant: when `run_process` returns, no
process of the run's process group is left running (timeout, cancel or normal exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from store.json_types import JsonObject

PROMPT_FIELD = "{prompt}"
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
OUTPUT_LIMIT = 64 * 1024  # characters of stdout / stderr kept in the database (the tail)
READ_LIMIT = 1024 * 1024  # bytes of output read back (the tail) for grading
SNAPSHOT_FILE_LIMIT = 64 * 1024
SNAPSHOT_TOTAL_LIMIT = 256 * 1024
SNAPSHOT_MAX_FILES = 200


@dataclass
class ProcessResult:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    cancelled: bool = False
    error: str | None = None  # it could not be started at all


def substitute_prompt(command: Sequence[str], prompt: str) -> list[str]:
    """Replace the literal `{prompt}` in every argument (no other braces are touched)."""
    return [arg.replace(PROMPT_FIELD, prompt) for arg in command]


def harness_env(
    base: Mapping[str, str], *, proxy_url: str, session_key: str, prompt: str, task_key: str
) -> dict[str, str]:
    root = proxy_url.rstrip("/")
    env = dict(base)
    # SDKs refuse to start without a key; the proxy passes it on or replaces it
    env.setdefault("OPENAI_API_KEY", "onthejob")
    env.setdefault("ANTHROPIC_API_KEY", "onthejob")
    env.update(
        OPENAI_BASE_URL=f"{root}/s/{session_key}/v1",
        OPENAI_API_BASE=f"{root}/s/{session_key}/v1",
        ANTHROPIC_BASE_URL=f"{root}/s/{session_key}",
        ONTHEJOB_PROMPT=prompt,
        ONTHEJOB_TASK=task_key,
        ONTHEJOB_SESSION=session_key,
    )
    return env


class Running:
    """The process groups of the runs in progress, so a cancel can end them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self.cancelled = threading.Event()

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)
        if self.cancelled.is_set():  # raced with a cancel: end it too
            terminate_group(proc)

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def cancel(self) -> None:
        """SIGTERM every running group now, SIGKILL what is left after KILL_GRACE."""
        self.cancelled.set()
        self._signal_all(signal.SIGTERM)
        timer = threading.Timer(KILL_GRACE, self._signal_all, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def _signal_all(self, sig: int) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            terminate_group(proc, sig)


def terminate_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_process(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: str,
    timeout: float | None,
    running: Running,
    shell: bool = False,
) -> ProcessResult:
    """Run to completion, at most `timeout` seconds; SIGTERM then SIGKILL its whole group.

    Output goes to files, not pipes: a daemon the harness leaves behind holding them open
    must not keep the run going after the harness itself has exited.
    """
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        given.write(stdin.encode())
        given.seek(0)
        try:
            proc = subprocess.Popen(
                args[0] if shell else list(args),
                shell=shell,
                cwd=cwd,
                env=dict(env),
                stdin=given,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: a kill reaches its children
            )
        except OSError as exc:
            return ProcessResult(None, "", "", error=f"cannot start {args[0]!r}: {exc}")
        running.add(proc)
        timed_out = False
        try:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(proc)
        finally:
            # children it left behind in its group go with it
            terminate_group(proc, signal.SIGKILL)
            running.discard(proc)
        return ProcessResult(
            proc.returncode,
            _tail(out),
            _tail(err),
            timed_out=timed_out,
            # a run that finished by itself just as the cancel came keeps its result
            cancelled=running.cancelled.is_set() and not timed_out and proc.returncode != 0,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    terminate_group(proc)
    try:
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        terminate_group(proc, signal.SIGKILL)
        proc.wait()


def _tail(file: IO[bytes], limit: int = READ_LIMIT) -> str:
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - limit))
    return file.read().decode("utf-8", errors="replace")


def clip(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """The tail of `text` (answers come last), without NULs (PostgreSQL text refuses them)."""
    text = text.replace("\x00", "")
    return text if len(text) <= limit else "[...]" + text[-limit:]


def snapshot(root: Path) -> JsonObject:
    """The working directory's final state: {relative path: text or a note}, bounded."""
    files: JsonObject = {}
    budget = SNAPSHOT_TOTAL_LIMIT
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(root).as_posix()
        if len(files) >= SNAPSHOT_MAX_FILES:
            files["..."] = "more files not kept"
            break
        size = path.stat().st_size
        if size > min(SNAPSHOT_FILE_LIMIT, budget):
            files[name] = {"bytes": size, "kept": False}
            continue
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            files[name] = {"bytes": size, "binary": True}
            continue
        files[name] = clip(text)
        budget -= size
    return files
