"""Resume the replicas a learner pauses to compute (--time-slice), once that learner is gone.

``python -m learner.resume_guard URL...``, its standard input a pipe from the learner. A
learner killed while it computes a step (SIGKILL, the OOM killer, a crash in native code)
runs no ``finally``: the replicas it paused would answer no one until another learner
starts. The learner starts this process beside it, in a session of its own (a signal to the
learner's group does not reach it), and holds the pipe's other end. When the pipe closes (the
learner exited, however, or closed it at a clean stop), it resumes every URL (a replica that
is not paused is left as it is) and exits.

Only the standard library: it must start fast and stay small.
"""

from __future__ import annotations

import signal
import sys
import time
import urllib.error
import urllib.request

ATTEMPTS = 5
TIMEOUT_S = 10.0


def resume(url: str) -> bool:
    """POST URL/resume, a few tries; True once it answered 2xx."""
    for attempt in range(ATTEMPTS):
        request = urllib.request.Request(url.rstrip("/") + "/resume", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return False  # it answered: nothing a retry would change
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25 * 2**attempt)
    return False


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m learner.resume_guard URL... (stdin: a pipe)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the learner
    while sys.stdin.buffer.read(4096):  # until the learner's end of the pipe is closed
        pass
    failed = [url for url in argv if not resume(url)]
    for url in failed:
        print(f"resume_guard: {url} did not resume: it may stay paused", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
