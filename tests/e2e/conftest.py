"""Fixtures of the end-to-end tier: the proxy in front of the session's real vLLM, and, for
the tests that swap weights into that shared replica (test_publisher, test_transfer_vllm),
the probe they verify with and the original weights put back after."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from learner.proxy_process import ProxyServer
from learner.swap.publisher import Probe, current_version
from learner.vllm_server import VLLMServer
from tests.support.weights import PROMPT, serve_again


@pytest.fixture
def proxy_args() -> list[str]:
    """`onthejob serve` flags of the `proxy` fixture beyond its upstream and database: a
    module that needs others (--fanout ...) overrides this fixture."""
    return []


@pytest.fixture
def proxy(
    vllm: VLLMServer,
    db_url: str,
    engine: Engine,
    start_proxy: Callable[..., ProxyServer],
    proxy_args: list[str],
) -> ProxyServer:
    """The proxy in front of the session's vLLM, recording into a fresh `db_url` (upgraded
    by `engine`)."""
    return start_proxy([vllm.url], db_url, args=proxy_args)


@pytest.fixture
def probe(tokenizer: Any) -> Probe:
    return Probe(prompt_token_ids=tokenizer.encode(PROMPT))


@pytest.fixture
def original(vllm: VLLMServer, tiny_model: Path, probe: Probe) -> Iterator[str]:
    """The version served before the test; the original weights are back after it."""
    version = current_version(vllm.url)
    yield version
    serve_again(vllm.url, tiny_model, probe, version)
