"""Fixtures of the integration tier: the proxy in front of the tests' one fake vLLM."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from learner.proxy_process import ProxyServer
from store import db
from tests.support.fake_vllm import FakeVLLM, Replier


@pytest.fixture
def fake_reply() -> Replier | None:
    """How the `proxy` fixture's fake vLLM answers: None, its constant answer; a module
    whose calls need scripted answers overrides this fixture."""
    return None


@pytest.fixture
def proxy(
    db_url: str, start_proxy: Callable[..., ProxyServer], fake_reply: Replier | None
) -> Iterator[ProxyServer]:
    """The proxy recording into `db_url` (upgraded), in front of a fake vLLM."""
    db.upgrade(db_url)
    with FakeVLLM(fake_reply) as upstream:
        yield start_proxy([upstream.url], db_url)
