"""Where the learner puts files that vLLM reads from memory: the host's shared memory.

One choice for both users: the full weights' transfer file (learner/swap/weight_file.py) and
the adapters' memory copies (learner/swap/adapter_memory.py). Torch-free: the adapter
publisher imports it, and the proxy's rollback imports that.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SHARED_MEMORY = Path("/dev/shm")  # a tmpfs on Linux: its files live in memory


def shared_memory_problem(directory: Path = SHARED_MEMORY) -> str | None:
    """Why ``directory`` cannot hold the learner's files in memory; None where it can."""
    if not directory.is_dir():
        return f"{directory} is not a directory here"
    if not os.access(directory, os.W_OK):
        return f"{directory} is not writable"
    return None


def default_directory() -> Path:
    """Shared memory where the machine has it, else the temporary directory."""
    if shared_memory_problem() is None:
        return SHARED_MEMORY
    return Path(tempfile.gettempdir())
