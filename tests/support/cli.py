"""Running `onthejob` as a subprocess."""

from __future__ import annotations

import subprocess
import sys


def onthejob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120
    )
