"""Client keys, drilled on a real proxy process over real HTTP, on SQLite and PostgreSQL.

Bound off loopback, a call without a valid key is refused with a 401 in its API's own shape on
all four generation APIs (the official openai and anthropic SDKs as clients), and recorded
nowhere; a key made through the admin API lets calls in and names their traffic. The key
itself never reaches the store, the proxy's log or the upstream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from sqlalchemy import Engine, select

from learner.proxy_process import ProxyServer
from store.models import Call, ClientKey
from tests.support.drills import wait_until
from tests.support.fake_vllm import FakeVLLM
from tests.support.records import count_calls, wait_for_calls

TOKEN = "keys-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "fake"
OFF_LOOPBACK = ["--host", "0.0.0.0"]
QUICK_KEYS = {"ONTHEJOB_ADMIN_TOKEN": TOKEN, "ONTHEJOB_KEY_POLL_INTERVAL": "0.1"}


def authorizations(upstream: FakeVLLM) -> list[str | None]:
    """The Authorization each generation request reached the upstream with."""
    return [headers.get("authorization") for headers in upstream.headers]


@pytest.fixture
def keyed_proxy(
    start_proxy: Callable[..., ProxyServer],
    fake_vllm: FakeVLLM,
    db_url: str,
    engine: Engine,
) -> ProxyServer:
    """A proxy bound off loopback (0.0.0.0) with an admin token: keys are required."""
    return start_proxy([fake_vllm.url], db_url, args=OFF_LOOPBACK, env=QUICK_KEYS)


def create_key(proxy: ProxyServer, name: str) -> dict[str, Any]:
    response = httpx.post(f"{proxy.url}/admin/api/keys", json={"name": name}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return response.json()


def openai_client(proxy: ProxyServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)


def anthropic_client(proxy: ProxyServer, **auth: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, max_retries=0, **auth)


def _four_calls(proxy: ProxyServer, key: str) -> dict[str, Callable[[], Any]]:
    """One call on each generation API, made with the official SDKs and `key`."""
    client = openai_client(proxy, key)
    messages = [{"role": "user", "content": "What is six times seven?"}]
    return {
        "chat.completions": lambda: client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8
        ),
        "completions": lambda: client.completions.create(
            model=MODEL, prompt="Six times seven is", max_tokens=8
        ),
        "responses": lambda: client.responses.create(
            model=MODEL, input="What is six times seven?", max_output_tokens=16
        ),
        "messages": lambda: anthropic_client(proxy, api_key=key).messages.create(
            model=MODEL, messages=messages, max_tokens=8
        ),
    }


RAW_CALLS = {
    "chat.completions": (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "completions": ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi"}),
    "messages": (
        "/v1/messages",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ),
}


def _assert_refused_in_shape(api: str, response: httpx.Response, words: str) -> None:
    assert response.status_code == 401, response.text
    body = response.json()
    if api == "messages":  # Anthropic's error shape
        assert body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        assert words in body["error"]["message"]
    else:  # OpenAI's
        assert body["error"]["type"] == "authentication_error"
        assert body["error"]["code"] in ("missing_api_key", "invalid_api_key")
        assert words in body["error"]["message"]


def test_off_loopback_a_missing_or_wrong_key_is_refused_on_every_api(
    keyed_proxy: ProxyServer, fake_vllm: FakeVLLM, engine: Engine, tmp_path: Path
) -> None:
    proxy = keyed_proxy
    # no key exists yet: every call is refused, and the answer says what to do
    early = httpx.post(proxy.url + RAW_CALLS["chat.completions"][0], json={})
    assert early.status_code == 401 and "POST /admin/api/keys" in early.json()["error"]["message"]

    made = create_key(proxy, "ci-runner")
    key = made["key"]
    assert made["name"] == "ci-runner" and key.startswith("otj_" + made["id"] + "_")

    for api, (path, body) in RAW_CALLS.items():  # no key at all: plain HTTP, no auth header
        _assert_refused_in_shape(api, httpx.post(proxy.url + path, json=body), "missing")

    wrong_keys = ["sk-not-a-key-of-ours", key[:-4] + "AAAA", "otj_0123456789abcdef_forged"]
    for wrong in wrong_keys:  # the official SDKs, each with its own header
        for api, call in _four_calls(proxy, wrong).items():
            sdk_error = anthropic.AuthenticationError if api == "messages" else None
            with pytest.raises(sdk_error or openai.AuthenticationError) as refused:
                call()
            assert refused.value.status_code == 401, api
            body = refused.value.body
            assert isinstance(body, dict)
            kind = body["error"]["type"] if api == "messages" else body["type"]
            assert kind == "authentication_error", (api, body)

    # the other routes that reach the model need a key too
    assert httpx.get(f"{proxy.url}/v1/models").status_code == 401
    count = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=RAW_CALLS["messages"][1])
    assert count.status_code == 401 and count.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{proxy.url}/v1/responses/resp_x").status_code == 401
    assert authorizations(fake_vllm) == []  # nothing refused ever reached the upstream

    # with the key: all four answered, each recorded under the key's name
    answers = {api: call() for api, call in _four_calls(proxy, key).items()}
    assert answers["chat.completions"].choices[0].message.content
    assert answers["messages"].content[0].text
    bearer = anthropic_client(proxy, auth_token=key).messages.create(  # Authorization: Bearer
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert bearer.content[0].text
    x_api_key = httpx.post(  # x-api-key on an OpenAI route
        proxy.url + RAW_CALLS["chat.completions"][0],
        json=RAW_CALLS["chat.completions"][1],
        headers={"x-api-key": key},
    )
    assert x_api_key.status_code == 200, x_api_key.text
    wait_for_calls(engine, 6)
    # the writer keeps log order: with these six in, any refused call would be too
    assert count_calls(engine) == 6 == count_calls(engine, key_name="ci-runner")
    with engine.connect() as conn:
        apis = sorted(conn.execute(select(Call.api)).scalars())
    assert apis == sorted([*RAW_CALLS, "messages", "chat.completions"])

    # the key itself is nowhere: not upstream, not in the store, not in the proxy's log
    assert set(authorizations(fake_vllm)) == {None}
    _assert_stored_only_as_digest(engine, key)
    assert key not in proxy.log_path.read_text()
    assert key.split("_", 2)[2] not in proxy.log_path.read_text()


def _assert_stored_only_as_digest(engine: Engine, key: str) -> None:
    with engine.connect() as conn:
        (row,) = conn.execute(select(ClientKey.__table__)).mappings()
        calls = [dict(r) for r in conn.execute(select(Call.__table__)).mappings()]
    assert row["digest"] == hashlib.sha256(key.encode()).hexdigest()
    stored = orjson.dumps([dict(row), calls], default=str).decode()
    assert key not in stored and key.split("_", 2)[2] not in stored


def test_keys_are_listed_without_secrets_revoked_and_named_again(
    keyed_proxy: ProxyServer, engine: Engine
) -> None:
    proxy = keyed_proxy
    first = create_key(proxy, "team-a")
    again = httpx.post(f"{proxy.url}/admin/api/keys", json={"name": "team-a"}, headers=ADMIN)
    assert again.status_code == 409 and "revoke it first" in again.json()["error"]["message"]
    bad = httpx.post(f"{proxy.url}/admin/api/keys", json={"name": "a,b"}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "name"
    assert httpx.post(f"{proxy.url}/admin/api/keys", json={"name": "x"}).status_code == 401

    listed = httpx.get(f"{proxy.url}/admin/api/keys", headers=ADMIN).json()
    assert listed["required"] is True
    assert [(k["name"], k["id"], k["revoked_at"]) for k in listed["items"]] == [
        ("team-a", first["id"], None)
    ]
    assert first["key"] not in str(listed) and "digest" not in str(listed)

    client = openai_client(proxy, first["key"])
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
    gone = httpx.delete(f"{proxy.url}/admin/api/keys/team-a", headers=ADMIN)
    assert gone.status_code == 204
    assert httpx.delete(f"{proxy.url}/admin/api/keys/team-a", headers=ADMIN).status_code == 404
    with pytest.raises(openai.AuthenticationError, match="revoked"):  # at once, on this proxy
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])

    second = create_key(proxy, "team-a")  # the name is free again: a new key, a new id
    assert second["id"] != first["id"]
    openai_client(proxy, second["key"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "c"}]
    )
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "d"}])
    wait_for_calls(engine, 2)
    assert count_calls(engine, key_name="team-a") == 2 == count_calls(engine)
    everything = httpx.get(f"{proxy.url}/admin/api/keys?revoked=true", headers=ADMIN).json()
    assert [(k["id"], k["revoked_at"] is None) for k in everything["items"]] == [
        (second["id"], True),
        (first["id"], False),
    ]


def test_a_key_made_on_one_proxy_opens_the_others_and_a_revoke_closes_them(
    start_proxy: Callable[..., ProxyServer],
    fake_vllm: FakeVLLM,
    db_url: str,
    engine: Engine,
    tmp_path: Path,
) -> None:
    one = start_proxy([fake_vllm.url], db_url, args=OFF_LOOPBACK, env=QUICK_KEYS)
    other = start_proxy(
        [fake_vllm.url], db_url, args=OFF_LOOPBACK, env=QUICK_KEYS, spool=tmp_path / "two.jsonl"
    )
    key = create_key(one, "shared")["key"]
    body = RAW_CALLS["chat.completions"][1]
    auth = {"Authorization": f"Bearer {key}"}

    def status_on_other() -> int:
        return httpx.post(other.url + "/v1/chat/completions", json=body, headers=auth).status_code

    wait_until(lambda: status_on_other() == 200, "the other proxy lets the key in", timeout=10)
    assert httpx.delete(f"{one.url}/admin/api/keys/shared", headers=ADMIN).status_code == 204
    wait_until(lambda: status_on_other() == 401, "the other proxy refuses it", timeout=10)


def test_on_loopback_keys_are_optional_but_ours_are_checked(
    start_proxy: Callable[..., ProxyServer],
    fake_vllm: FakeVLLM,
    db_url: str,
    engine: Engine,
) -> None:
    proxy = start_proxy([fake_vllm.url], db_url, env=QUICK_KEYS)
    path, body = RAW_CALLS["chat.completions"]
    key = create_key(proxy, "local")["key"]

    anonymous = httpx.post(proxy.url + path, json=body)
    theirs = httpx.post(proxy.url + path, json=body, headers={"Authorization": "Bearer vllm-key"})
    ours = httpx.post(proxy.url + path, json=body, headers={"x-api-key": key})
    assert [r.status_code for r in (anonymous, theirs, ours)] == [200, 200, 200]
    httpx.delete(f"{proxy.url}/admin/api/keys/local", headers=ADMIN)
    revoked = httpx.post(proxy.url + path, json=body, headers={"x-api-key": key})
    assert revoked.status_code == 401  # a revoked key of ours means no, on loopback too

    wait_for_calls(engine, 3)
    with engine.connect() as conn:
        names = list(conn.execute(select(Call.key_name).order_by(Call.started_at)).scalars())
    assert names == [None, None, "local"]
    # a value that is not one of our keys may be vLLM's own: it goes on; ours never does
    assert authorizations(fake_vllm) == [None, "Bearer vllm-key", None]
    assert httpx.get(f"{proxy.url}/admin/api/keys", headers=ADMIN).json()["required"] is False


def test_require_keys_on_loopback(
    start_proxy: Callable[..., ProxyServer],
    fake_vllm: FakeVLLM,
    db_url: str,
    engine: Engine,
) -> None:
    proxy = start_proxy([fake_vllm.url], db_url, args=["--require-keys"], env=QUICK_KEYS)
    path, body = RAW_CALLS["messages"]
    refused = httpx.post(proxy.url + path, json=body, headers={"x-api-key": "anything"})
    assert refused.status_code == 401 and refused.json()["type"] == "error"
    key = create_key(proxy, "behind-nginx")["key"]
    assert httpx.post(proxy.url + path, json=body, headers={"x-api-key": key}).status_code == 200
