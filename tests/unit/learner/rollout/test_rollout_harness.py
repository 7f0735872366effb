"""One harness run: prompt substitution, environment, bounded processes, snapshots, and the
reward a check command prints. Real subprocesses."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from learner.rollout.grading import reward_from_check
from learner.rollout.harness import Running, harness_env, run_process, snapshot, substitute_prompt


def test_prompt_goes_into_arguments_literally() -> None:
    command = ["agent", "--task={prompt}", "{prompt}", "{other}", "{{prompt}}"]
    assert substitute_prompt(command, "say {x} $HOME") == [
        "agent",
        "--task=say {x} $HOME",
        "say {x} $HOME",
        "{other}",
        "{say {x} $HOME}",
    ]


def test_environment_points_every_sdk_at_the_session() -> None:
    env = harness_env(
        {"OPENAI_API_KEY": "mine", "PATH": "/bin"},
        proxy_url="http://p:1/",
        session_key="rollout-1",
        prompt="hi",
        task_key="t",
    )
    assert env["OPENAI_BASE_URL"] == env["OPENAI_API_BASE"] == "http://p:1/s/rollout-1/v1"
    assert env["ANTHROPIC_BASE_URL"] == "http://p:1/s/rollout-1"
    assert (env["OPENAI_API_KEY"], env["ANTHROPIC_API_KEY"]) == ("mine", "onthejob")
    assert (env["ONTHEJOB_PROMPT"], env["ONTHEJOB_TASK"], env["PATH"]) == ("hi", "t", "/bin")


def test_stdin_stdout_and_exit_code(tmp_path: Path) -> None:
    script = "import sys; data = sys.stdin.read(); print(data.upper()); sys.exit(3)"
    result = run_process(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=os.environ,
        stdin="the prompt",
        timeout=30,
        running=Running(),
    )
    assert (result.exit_code, result.stdout, result.timed_out) == (3, "THE PROMPT\n", False)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    # the harness starts a child that ignores SIGTERM and holds no pipe: both must go
    script = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    result = run_process(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=os.environ,
        stdin="",
        timeout=8,  # ample to start both processes on a loaded machine
        running=Running(),
    )
    assert result.timed_out and result.stdout == "started\n"
    assert time.monotonic() - started < 8 + 2 + 5
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while not _gone(child):
        assert time.monotonic() < deadline, "child of the harness survived"
        time.sleep(0.05)


def test_cancel_ends_a_running_process(tmp_path: Path) -> None:
    running = Running()
    marker = tmp_path / "up"
    script = f"import time; open({str(marker)!r}, 'w').close(); time.sleep(600)"
    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            run_process(
                [sys.executable, "-c", script],
                cwd=tmp_path,
                env=os.environ,
                stdin="",
                timeout=300,
                running=running,
            )
        )
    )
    worker.start()
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    running.cancel()
    worker.join(timeout=10)
    assert not worker.is_alive()
    (result,) = results
    assert result.cancelled and not result.timed_out and result.exit_code != 0


def test_a_command_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    result = run_process(
        ["/nonexistent/agent"],
        cwd=tmp_path,
        env=os.environ,
        stdin="",
        timeout=5,
        running=Running(),
    )
    assert result.error and "cannot start" in result.error and result.exit_code is None


def test_snapshot_keeps_text_and_notes_the_rest(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "big.txt").write_text("x" * 200_000)
    (tmp_path / "link").symlink_to(tmp_path / "src" / "a.py")
    files = snapshot(tmp_path)
    assert files == {
        "big.txt": {"bytes": 200_000, "kept": False},
        "blob.bin": {"bytes": 3, "binary": True},
        "src/a.py": "print(1)\n",
    }


def test_reward_from_a_check_command() -> None:
    assert reward_from_check(0, "") == 1.0
    assert reward_from_check(1, "tests failed\n") == 0.0
    assert reward_from_check(1, "3 passed\n0.75\n\n") == 0.75  # a printed number wins
    assert reward_from_check(0, "score: nan\nnan") == 1.0  # not a finite number


def test_a_daemon_left_behind_does_not_hold_the_run(tmp_path: Path) -> None:
    # the harness exits at once, leaving a process in its own session with its stdout
    script = (
        "import subprocess, sys\n"
        "d = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " start_new_session=True)\n"
        "open('daemon.pid', 'w').write(str(d.pid))\n"
        "print('done')\n"
    )
    started = time.monotonic()
    result = run_process(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=os.environ,
        stdin="",
        timeout=20,
        running=Running(),
    )
    os.kill(int((tmp_path / "daemon.pid").read_text()), signal.SIGKILL)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "done\n", False)
    assert time.monotonic() - started < 20  # not the daemon's 30 s
