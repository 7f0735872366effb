"""learner.graders.command: real shell commands as graders."""

from __future__ import annotations

import shlex
import sys
import time

import pytest

from learner.graders.base import Grade
from learner.graders.command import CommandGrader
from store.tasks import TaskTable
from tests.support.trajectories import answered

PY = shlex.quote(sys.executable)


def _grade(command: str, *answers: str, timeout: float = 30.0) -> list[Grade]:
    grader = CommandGrader(command, timeout=timeout)
    return grader.grade([answered(a) for a in answers or ("x",)], tasks=TaskTable())


def test_reads_the_trajectory_from_stdin() -> None:
    script = (
        "import json, sys; t = json.load(sys.stdin); "
        "print('log line'); print(len(t['calls'][0]['response']['choices'][0]['message']"
        "['content'])); print()"
    )
    grades = _grade(f"{PY} -c {shlex.quote(script)}", "ab", "abcde")
    assert [g.reward for g in grades] == [2.0, 5.0]
    assert grades[0].error is None and grades[0].detail["exit_code"] == 0
    assert "log line" in grades[0].detail["stdout_tail"]


def test_shell_features_and_name() -> None:
    grader = CommandGrader("echo 0.5 | cat")
    assert grader.name == "command:echo 0.5 | cat"
    (grade,) = grader.grade([answered("x")], tasks=TaskTable())
    assert grade.reward == 0.5


def test_nonzero_exit_is_an_error_with_the_stderr_tail() -> None:
    (grade,) = _grade("echo 1; echo 'tests failed' >&2; exit 3")
    assert grade.reward is None
    assert grade.error == "exited with status 3; stderr: tests failed"
    assert grade.detail["exit_code"] == 3


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("echo not-a-number", "bad output: last line 'not-a-number' is not a number"),
        ("true", "bad output: no output on stdout"),
        ("echo nan", "bad output: expected a finite number"),
    ],
)
def test_unparsable_output_is_an_error(command: str, message: str) -> None:
    (grade,) = _grade(command)
    assert grade.reward is None and grade.error is not None and grade.error.startswith(message)


def test_timeout_kills_the_whole_process_group() -> None:
    started = time.monotonic()
    # The shell starts a background sleeper too: it must die with the group.
    (grade,) = _grade("echo started >&2; sleep 5 & sleep 5", timeout=0.5)
    assert time.monotonic() - started < 4
    assert grade.reward is None
    assert grade.error == "timed out after 0.5 s, killed; stderr: started"


def test_commands_run_concurrently() -> None:
    started = time.monotonic()
    grades = _grade("sleep 0.5; echo 1", "a", "b", "c", "d")
    assert [g.reward for g in grades] == [1.0] * 4
    assert time.monotonic() - started < 1.8


def test_empty_command_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        CommandGrader("  ")
