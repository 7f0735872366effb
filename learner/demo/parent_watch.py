"""Run a command, and stop its process group once the process that started it is gone.

``python -m learner.demo.parent_watch PARENT_PID -- COMMAND...``. VLLMServer starts vLLM
through it: vLLM runs in its own process group, so a parent killed without a chance to
stop it (SIGKILL, a CI timeout, the OOM killer) left vLLM and its engine running, a model's
memory and both cores held for good. This process notices (it is re-parented) within a
second and stops the group as ``VLLMServer.stop`` does: SIGTERM, then SIGKILL.

Only the standard library: it starts before anything else and must stay small.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

POLL_S = 1.0  # how soon a dead parent is noticed
GRACE_S = 20.0  # for vLLM to shut its engine down after SIGTERM


def stop_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to our process group (ourselves excepted), SIGKILL after the grace."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(0, signal.SIGKILL)  # engine processes that outlived the server, and us


def exit_status(returncode: int) -> int:
    """The child's status as a shell reports it (128 + N for a death by signal N)."""
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        usage = "usage: python -m learner.demo.parent_watch PARENT_PID -- COMMAND..."
        print(usage, file=sys.stderr)
        return 2
    parent = int(argv[0])
    child = subprocess.Popen(argv[2:])
    # a SIGTERM sent to this process alone (not to the group) reaches the command too
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    while True:
        try:
            return exit_status(child.wait(timeout=POLL_S))
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            stop_group(child)
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
