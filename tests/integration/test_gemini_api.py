"""The Gemini API in-process against one fake vLLM, on SQLite and PostgreSQL, through the
official google-genai SDK: generateContent whole and streamed (SSE, and the JSON array
without `alt=sse`) and the model list are answered (countTokens asks vLLM's tokenizer:
tests/e2e/test_harness_clis_vllm.py), every generation is
recorded token-exact, fields the proxy does not know are recorded and not forwarded, and
bad input gets Google's own error shape."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.support.fake_vllm import ANSWER, LOGPROBS, TOKEN_IDS, FakeVLLM, Whole
from tests.support.inprocess import in_process_proxy
from tests.support.records import export


def settings(fake_vllm: FakeVLLM, db_url: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "upstreams": [fake_vllm.url],
        "database_url": db_url,
        "spool_path": tmp_path / "spool.jsonl",
    }


def test_generate_content_whole_and_streamed_is_answered_and_recorded(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    from google.genai import types

    async def calls() -> tuple[list[str], list[dict[str, Any]], bytes]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            client = proxy.gemini(session="gemini-1").aio
            config = types.GenerateContentConfig(
                system_instruction="You are terse.",
                temperature=0.5,
                max_output_tokens=8,
                thinking_config=types.ThinkingConfig(include_thoughts=True),
            )
            whole = await client.models.generate_content(model="fake", contents="hi", config=config)
            pieces = [
                chunk.text or ""
                async for chunk in await client.models.generate_content_stream(
                    model="fake",
                    contents=[
                        types.Content(role="user", parts=[types.Part(text="hi")]),
                        types.Content(role="model", parts=[types.Part(text=ANSWER)]),
                        types.Content(role="user", parts=[types.Part(text="again")]),
                    ],
                    config=config,
                )
            ]
            models = (await proxy.http.get("/v1beta/models")).json()["models"]
            # without alt=sse the stream is one JSON array, as Google's servers send it
            body = {"contents": [{"parts": [{"text": "hi"}]}], "safetySettings": [],
                    "speculativeNewField": {"x": 1}}  # fmt: skip
            array = await proxy.http.post("/v1beta/models/fake:streamGenerateContent", json=body)
            return [whole.text or "", "".join(pieces)], models, array.content

    texts, models, array = asyncio.run(calls())
    assert texts == [ANSWER, ANSWER]
    assert [m["name"] for m in models] == ["models/fake"]
    chunks = json.loads(array)  # a complete JSON array of GenerateContentResponse chunks
    assert (
        "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])
        == ANSWER
    )
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == len(TOKEN_IDS)
    calls = [c for t in export(engine) for c in t["calls"]]
    assert len(calls) == 3 and {c["api"] for c in calls} == {"gemini"}
    for call in calls:
        assert call["status"] == "ok" and call["model"] == "fake"
        assert call["completion_token_ids"] == TOKEN_IDS
        assert call["completion_logprobs"] == LOGPROBS
    first, second, third = sorted(calls, key=lambda c: c["started_at"])
    assert first["stream"] is False and second["stream"] is True
    assert "generationConfig.thinkingConfig" in first["compat"]["honoured"]
    # the second turn continues the first: one trajectory under the session
    assert sorted(t["session"] or "" for t in export(engine)).count("gemini-1") == 1
    assert third["compat"]["unknown"] == ["speculativeNewField"]
    assert third["compat"]["ignored"] == ["safetySettings"]


def test_bad_input_gets_google_s_error_shape(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    from google.genai import errors, types

    async def refusals() -> tuple[Any, dict[str, Any], dict[str, Any], int]:
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path)) as proxy:
            with pytest.raises(errors.ClientError) as refused:
                await proxy.gemini().aio.models.generate_content(
                    model="fake",
                    contents="hi",
                    config=types.GenerateContentConfig(candidate_count=2),
                )
            unknown_part = await proxy.http.post(
                "/v1beta/models/fake:generateContent",
                json={"contents": [{"parts": [{"fileData": {"fileUri": "gs://x"}}]}]},
            )
            no_method = await proxy.http.post("/v1beta/models/fake:embedContent", json={})
            garbage = await proxy.http.post(
                "/v1beta/models/fake:generateContent", content=b"{not json"
            )
            return refused.value, unknown_part.json(), no_method.json(), garbage.status_code

    refused, unknown_part, no_method, garbage = asyncio.run(refusals())
    assert refused.code == 400 and refused.status == "INVALID_ARGUMENT"
    assert "candidateCount" in refused.message
    # conversation content is never dropped silently: a part we cannot show is a 400
    assert unknown_part["error"]["status"] == "INVALID_ARGUMENT"
    assert "fileData" in unknown_part["error"]["message"]
    assert no_method["error"] == {
        "code": 404,
        "message": no_method["error"]["message"],
        "status": "NOT_FOUND",
    }
    assert garbage == 400
    assert [c for t in export(engine) for c in t["calls"] if c["status"] == "ok"] == []


def test_a_key_in_the_query_string_is_read_as_the_header(
    fake_vllm: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """Google's REST API takes `?key=`: ours lets the call in under its name, a wrong one
    of ours is refused, and an upstream that cannot list its models is a 502 (its reason)."""
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    path = "/v1beta/models/fake:generateContent"

    async def calls() -> dict[str, Any]:
        out: dict[str, Any] = {}
        extra = {"admin_token": "t", "require_keys": True}
        async with in_process_proxy(**settings(fake_vllm, db_url, tmp_path), **extra) as proxy:
            made = await proxy.http.post(
                "/admin/api/keys", json={"name": "gem"}, headers={"Authorization": "Bearer t"}
            )
            key = made.json()["key"]
            out["query"] = await proxy.http.post(f"{path}?key={key}", json=body)
            out["wrong"] = await proxy.http.post(f"{path}?key={key[:-2]}xx", json=body)
            out["none"] = await proxy.http.post(path, json=body)
            out["models"] = await proxy.http.get(f"/v1beta/models?key={key}")
            fake_vllm.models_error = Whole({"error": {"message": "oom"}}, 500)
            out["models down"] = await proxy.http.get(f"/v1beta/models?key={key}")
        return out

    out = asyncio.run(calls())
    assert out["query"].status_code == 200, out["query"].text
    assert out["wrong"].status_code == 401
    assert out["wrong"].json()["error"]["status"] == "UNAUTHENTICATED"
    assert out["none"].status_code == 401
    assert [m["baseModelId"] for m in out["models"].json()["models"]] == ["fake"]
    down = out["models down"]
    assert down.status_code == 502
    assert "500" in down.json()["error"]["message"] and "oom" in down.json()["error"]["message"]
    recorded = [c for t in export(engine) for c in t["calls"]]
    assert [(c["status"], c["key_name"]) for c in recorded] == [("ok", "gem")]
