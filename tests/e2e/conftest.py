"""Fixtures of the tests that swap weights into a shared replica (test_publisher,
test_transfer_vllm): the probe they verify with, and the original weights put back after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from learner.swap.publisher import Probe, current_version
from learner.vllm_server import VLLMServer
from tests.support.weights import PROMPT, serve_again


@pytest.fixture
def probe(tokenizer: Any) -> Probe:
    return Probe(prompt_token_ids=tokenizer.encode(PROMPT))


@pytest.fixture
def original(vllm: VLLMServer, tiny_model: Path, probe: Probe) -> Iterator[str]:
    """The version served before the test; the original weights are back after it."""
    version = current_version(vllm.url)
    yield version
    serve_again(vllm.url, tiny_model, probe, version)
