"""The proxy app in-process (httpx.ASGITransport) against one fake vLLM, on SQLite and
PostgreSQL: the official SDKs' calls are answered and recorded token-exact, bad input gets
each API's own error shape, and the admin API wants its token."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anthropic
import openai
import pytest
from sqlalchemy import Engine

from tests.support.fake_vllm import ANSWER, LOGPROBS, TOKEN_IDS, FakeVLLM
from tests.support.inprocess import in_process_proxy
from tests.support.records import export


def settings(fake_vllm: FakeVLLM, db_url: str, tmp_path: Path, **extra: object) -> dict:
    return {
        "upstreams": [fake_vllm.url],
        "database_url": db_url,
        "spool_path": tmp_path / "spool.jsonl",
        **extra,
    }


def test_sdk_calls_are_answered_and_recorded_token_exact(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def calls() -> list[str]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            chat = proxy.openai(session="agent-1")
            whole = await chat.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            streamed = await chat.chat.completions.create(
                model="fake",
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": ANSWER},
                    {"role": "user", "content": "again"},
                ],
                max_tokens=8,
                stream=True,
            )
            pieces = [c.choices[0].delta.content or "" async for c in streamed if c.choices]
            message = await proxy.anthropic().messages.create(
                model="fake", max_tokens=8, messages=[{"role": "user", "content": "hello"}]
            )
            text = message.content[0].text  # type: ignore[union-attr]
            return [whole.choices[0].message.content or "", "".join(pieces), text]

    assert asyncio.run(calls()) == [ANSWER] * 3
    recorded = [c for t in export(engine) for c in t["calls"]]
    assert len(recorded) == 3
    for call in recorded:
        assert call["status"] == "ok" and call["completion_token_ids"] == TOKEN_IDS
        assert call["completion_logprobs"] == LOGPROBS
    sessions = sorted(t["session"] or "" for t in export(engine))
    assert sessions.count("agent-1") == 1  # the two chat turns are one trajectory


def test_bad_input_gets_each_api_s_own_error_shape_and_nothing_is_recorded(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def refusals() -> tuple[Exception, Exception, int]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            with pytest.raises(openai.BadRequestError) as chat:
                await proxy.openai().chat.completions.create(model="fake", messages=[])
            with pytest.raises(anthropic.BadRequestError) as messages:
                await proxy.anthropic().messages.create(
                    model="fake", max_tokens=-1, messages=[{"role": "user", "content": "x"}]
                )
            raw = await proxy.http.post("/v1/chat/completions", content=b"{not json")
            assert raw.json()["error"]["type"] == "invalid_request_error"
            return chat.value, messages.value, raw.status_code

    chat, messages, status = asyncio.run(refusals())
    assert isinstance(chat, openai.BadRequestError) and "messages" in str(chat)
    assert messages.body["type"] == "error"  # type: ignore[attr-defined]
    assert status == 400
    assert [c for t in export(engine) for c in t["calls"] if c["status"] == "ok"] == []


def test_the_admin_api_wants_its_token(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    async def answers() -> tuple[int, int]:
        config = settings(fake_vllm, db_url, tmp_path, admin_token="in-process-token")
        async with in_process_proxy(**config) as proxy:
            refused = await proxy.http.get("/admin/api/trajectories")
            allowed = await proxy.http.get(
                "/admin/api/trajectories", headers={"Authorization": "Bearer in-process-token"}
            )
            return refused.status_code, allowed.status_code

    assert asyncio.run(answers()) == (401, 200)
