"""parent_watch stops what it runs once its parent is gone, and otherwise stays out of the
way: the command's exit status comes through, and a SIGTERM reaches the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WATCH = [sys.executable, "-m", "learner.demo.parent_watch"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (init may reap it late)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def wait_for(predicate, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_the_command_stops_when_the_parent_is_killed() -> None:
    # a parent that starts the watch (in its own group, as VLLMServer does) and is then
    # killed with no chance to stop it
    launcher = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen({WATCH!r} + [str(os.getpid()), '--'] + {SLEEPER!r},"
        " start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    watch = int(parent.stdout.readline())
    assert wait_for(lambda: len(children(watch)) == 1)
    command = children(watch)[0]
    try:
        assert alive(command)
        parent.kill()
        parent.wait()
        assert wait_for(lambda: not alive(command)), "the command outlived its parent"
        assert wait_for(lambda: not alive(watch))
    finally:
        for pid in (command, watch):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_commands_exit_status_comes_through() -> None:
    status = subprocess.run(
        [*WATCH, str(os.getpid()), "--", sys.executable, "-c", "raise SystemExit(3)"]
    ).returncode
    assert status == 3


def test_a_sigterm_to_the_watch_reaches_the_command() -> None:
    watch = subprocess.Popen([*WATCH, str(os.getpid()), "--", *SLEEPER])
    try:
        assert wait_for(lambda: len(children(watch.pid)) == 1)
        watch.terminate()
        assert watch.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        for pid in [*children(watch.pid), watch.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_wrong_call_says_how_to_call_it() -> None:
    run = subprocess.run([*WATCH, "12"], capture_output=True, text=True)
    assert run.returncode == 2
    assert "usage:" in run.stderr


def test_the_demo_s_proxy_stops_when_the_demo_is_killed(tmp_path: Path) -> None:
    """The demo starts its proxy and learner (learner/demo/run.py `_start`) as it starts
    vLLM: a demo killed without its clean-up (a bench that runs it, sent SIGTERM) left them
    running for good."""
    from learner.vllm_server import free_port

    db_url = f"sqlite:///{tmp_path / 'demo.db'}"
    launcher = (
        "import time\n"
        "from pathlib import Path\n"
        "from learner.demo.run import _start\n"
        "from store import db\n"
        f"db.upgrade({db_url!r})\n"
        f"p = _start(['serve', '--db', {db_url!r}, '--upstream', 'http://127.0.0.1:9',"
        f" '--port', '{free_port()}'], Path({str(tmp_path / 'proxy.log')!r}))\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    demo = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE)
    assert demo.stdout is not None
    watch = int(demo.stdout.readline())
    assert wait_for(lambda: len(children(watch)) == 1)
    proxy = children(watch)[0]
    try:
        assert alive(proxy)
        demo.kill()
        demo.wait()
        assert wait_for(lambda: not alive(proxy)), "the proxy outlived the demo"
    finally:
        for pid in (proxy, watch):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
