"""Bounded polls on what a subprocess writes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout: float = 300) -> None:
    """Poll (bounded) until `text` is in the log of the running `process`."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r}: {log.read_text()[-2000:]}"
        time.sleep(0.2)
