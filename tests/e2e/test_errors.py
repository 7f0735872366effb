"""Bad input and failing upstreams: clear errors in the OpenAI shape, every call recorded."""

from __future__ import annotations

import httpx
import openai
import pytest
from sqlalchemy import Engine, select

from learner.vllm_server import free_port
from store.models import Call
from tests.support.records import wait_for_calls


def recorded(engine: Engine) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(select(Call.__table__).order_by(Call.started_at)).all()
    return [dict(r._mapping) for r in rows]


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.vllm
def test_bad_requests_get_400_and_are_recorded(vllm, db_url, engine, start_proxy):
    proxy = start_proxy([vllm.url], db_url, args=["--max-body-bytes", "4096"])
    url = proxy.url + "/s/bad/v1/chat/completions"
    cases = [
        (b"{not json", "invalid_json"),
        (b"", "invalid_json"),
        (b"[1, 2]", "invalid_body"),
        (b'{"model": "m"}', "missing_required"),
        (b'{"model": "m", "messages": "hi"}', "invalid_type"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
            "invalid_type",
        ),
        (
            b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}',
            "request_too_large",
        ),
    ]
    for body, code in cases:
        response = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert_openai_error(response, 400, code)
    wait_for_calls(engine, len(cases))
    calls = recorded(engine)
    assert [c["http_status"] for c in calls] == [400] * len(cases)
    assert all(c["status"] == "error" and c["error"] for c in calls)
    assert all(c["session_key"] == "bad" for c in calls)


@pytest.mark.vllm
def test_vllm_errors_pass_through_unchanged(vllm, db_url, engine, start_proxy):
    proxy = start_proxy([vllm.url], db_url)
    for body in (
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        {
            "model": vllm.model_name,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100000,
        },
        {
            "model": vllm.model_name,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 100000,
            "stream": True,
        },
    ):
        direct = httpx.post(vllm.url + "/v1/chat/completions", json=body, timeout=30)
        proxied = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
        assert 400 <= direct.status_code < 500
        assert proxied.status_code == direct.status_code
        assert proxied.json() == direct.json()
    wait_for_calls(engine, 3)
    assert [c["http_status"] for c in recorded(engine)] == [404, 400, 400]
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="x").chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}]
        )


def test_unreachable_upstream_is_502_naming_it(db_url, engine, start_proxy):
    dead = f"http://127.0.0.1:{free_port()}"
    proxy = start_proxy([dead], db_url)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    error = assert_openai_error(
        httpx.post(proxy.url + "/v1/chat/completions", json=body), 502, "upstream_unavailable"
    )
    assert dead in error["message"]
    stream = httpx.post(proxy.url + "/v1/chat/completions", json=body | {"stream": True})
    assert_openai_error(stream, 502, "upstream_unavailable")
    wait_for_calls(engine, 2)
    assert [c["http_status"] for c in recorded(engine)] == [502, 502]


@pytest.mark.vllm
def test_upstream_timeout_is_504(vllm, db_url, engine, start_proxy):
    proxy = start_proxy([vllm.url], db_url, args=["--upstream-timeout", "0.3"])
    body = {
        "model": vllm.model_name,
        "messages": [{"role": "user", "content": "a long answer please"}],
        "max_tokens": 1900,
        "ignore_eos": True,
    }
    error = assert_openai_error(
        httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30),
        504,
        "upstream_timeout",
    )
    assert vllm.url in error["message"]
    wait_for_calls(engine, 1)
    assert recorded(engine)[0]["http_status"] == 504


def test_unknown_routes_answer_json_errors(db_url, engine, start_proxy):
    proxy = start_proxy([f"http://127.0.0.1:{free_port()}"], db_url)
    assert_openai_error(httpx.get(proxy.url + "/nope"), 404)
    assert_openai_error(httpx.post(proxy.url + "/healthz"), 405)
    # vLLM's dev-mode endpoints live outside /v1 and are never forwarded
    for path in ("/collective_rpc", "/pause", "/update_weight_version", "/weight_info"):
        assert httpx.post(proxy.url + path, json={}).status_code in (404, 405)


@pytest.mark.vllm
def test_dev_mode_routes_stay_unreachable_through_dot_segments(vllm, db_url, engine, start_proxy):
    import http.client

    proxy = start_proxy([vllm.url], db_url)
    paths = [
        "/v1/../is_paused",
        "/v1/%2e%2e/is_paused",
        "/v1/x/%2e%2e/%2e%2e/server_info",
        "/v1/%2E%2E/weight_info",
        "/v1/x/../load_lora_adapter",
        "/v1/..%2fpause",
        # variants of recorded routes must not be answered unrecorded
        "/v1/chat/completions/",
        "/v1/chat/completions/batch",
    ]
    for path in paths:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 403, (path, response.status)
        connection.close()
    assert httpx.get(proxy.url + "/v1/models").status_code == 200


def test_malformed_translated_bodies_are_400_and_recorded(db_url, engine, start_proxy):
    proxy = start_proxy([f"http://127.0.0.1:{free_port()}"], db_url)
    bodies = [
        {"model": "m", "input": "hi", "reasoning": "high"},
        {"model": "m", "input": "hi", "include": [{}]},
        {"model": "m", "input": [{"role": [], "content": "x"}]},
    ]
    for body in bodies:
        assert_openai_error(httpx.post(proxy.url + "/v1/responses", json=body), 400)
    wait_for_calls(engine, len(bodies))
    assert [c["http_status"] for c in recorded(engine)] == [400] * len(bodies)
