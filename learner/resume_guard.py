"""Resume the replicas a learner pauses to compute (--time-slice), once that learner is gone.

``python -m learner.resume_guard URL...``, its standard input a pipe from the learner. A
learner killed while it computes a step (SIGKILL, the OOM killer, a crash in native code)
runs no ``finally``: the replicas it paused would answer no one until another learner
starts. The learner starts this process beside it, in a session of its own (a signal to the
learner's group does not reach it; it ignores SIGINT, SIGTERM and SIGHUP, which a service
manager may send to every process of the learner's unit), and holds the pipe's other end;
only SIGKILL ends it early. When the pipe closes (the learner exited, however, or closed it
at a clean stop), it resumes every URL (a replica that is not paused is left as it is) and
exits.

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
    """POST URL/resume, a few tries; False only when it stayed unanswered or answered 5xx
    (a 4xx, or nothing listening, is a replica with nothing of ours paused)."""
    for attempt in range(ATTEMPTS):
        request = urllib.request.Request(url.rstrip("/") + "/resume", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return True  # no such route (no dev mode): nothing was paused there
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                return True  # stopped: a replica that starts again is not paused
        except OSError:
            pass
        time.sleep(0.25 * 2**attempt)
    return False


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m learner.resume_guard URL... (stdin: a pipe)", file=sys.stderr)
        return 2
    # Signals meant for the learner (a Ctrl-C, a service manager's stop of the whole unit):
    # this process ends once the learner's end of the pipe closes, and a clean stop kills it
    # if it does not.
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # until the learner's end of the pipe is closed
        pass
    failed = [url for url in argv if not resume(url)]
    for url in failed:
        print(f"resume_guard: {url} did not resume: it may stay paused", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
