"""The `command:SHELL_COMMAND` grader: the trajectory as JSON on stdin, a reward on stdout.

The reward is the last non-empty line of stdout, so a test runner may print freely before
it. Invariant: a command never outlives its timeout; its whole process group is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

from learner.graders.base import Grade, as_reward
from store.export import to_export
from store.tasks import TaskTable
from store.trajectory_record import Trajectory

_TAIL_CHARS = 2000  # of stdout/stderr kept in the detail and error


class CommandGrader:
    def __init__(self, command: str, *, timeout: float = 30.0, workers: int = 4) -> None:
        if not command.strip():
            raise ValueError("command grader: the command is empty")
        self.name = f"command:{command}"
        self.command = command
        self.timeout = timeout
        self.workers = workers  # commands often wait on I/O or run tests: overlap them

    def grade(self, trajectories: list[Trajectory], *, tasks: TaskTable) -> list[Grade]:
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            return list(pool.map(self._grade_one, trajectories))

    def _grade_one(self, trajectory: Trajectory) -> Grade:
        # the export format: what the command reads is a public interface
        stdin = json.dumps(to_export(trajectory), default=str).encode()
        try:
            code, out, err = run_command(self.command, stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            # a busy machine or a slow service: another try may finish in time
            note = _tail_note(exc.stderr)
            return Grade.retry(f"timed out after {self.timeout:g} s, killed{note}")
        except OSError as exc:  # out of processes or file handles, for the shell itself
            return Grade.retry(f"could not run the command: {exc}")
        detail = {"exit_code": code, "stdout_tail": _tail(out), "stderr_tail": _tail(err)}
        if code != 0:
            return Grade(None, detail, error=f"exited with status {code}{_tail_note(err)}")
        try:
            return Grade(reward=as_reward(_last_line_number(out)), detail=detail)
        except ValueError as exc:
            return Grade(None, detail, error=f"bad output: {exc}{_tail_note(err)}")


def run_command(command: str, stdin: bytes, *, timeout: float) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, stderr) of `command` run by the shell in its own process group."""
    # Its own session: on timeout we kill the shell and everything it started, not just sh.
    proc = subprocess.Popen(
        command,
        shell=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        exc.stderr = _drain_stderr(proc)
        raise
    return proc.returncode, out, err


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _drain_stderr(proc: subprocess.Popen[bytes]) -> bytes | None:
    """What the killed command wrote to stderr; a grandchild that left the process group could
    hold the pipes open forever, so this waits only briefly."""
    try:
        return proc.communicate(timeout=2)[1]
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return None


def _last_line_number(out: bytes) -> float:
    lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        raise ValueError("no output on stdout; expected a number on the last line")
    try:
        return float(lines[-1])
    except ValueError:
        raise ValueError(f"last line {lines[-1][:200]!r} is not a number") from None


def _tail(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        data = data.decode(errors="replace")
    return (data or "")[-_TAIL_CHARS:]


def _tail_note(stderr: bytes | str | None) -> str:
    tail = _tail(stderr).strip()
    return f"; stderr: {tail}" if tail else ""
