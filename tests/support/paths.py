"""Where things are, for tests at any depth of tests/."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
ARTIFACTS = ROOT / "test-artifacts"  # logs of the servers the tests start (CI keeps them)

# For quick local iterations: a vLLM server already serving the tiny model, or the model's
# directory, instead of the ones the session starts (tests/conftest.py)
REUSE_VLLM_URL = os.environ.get("ONTHEJOB_TEST_VLLM_URL")
REUSE_MODEL_DIR = os.environ.get("ONTHEJOB_TEST_MODEL_DIR")
