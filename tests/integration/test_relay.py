"""Streaming relay mechanics, with an upstream whose stream the test steps through
(tests/support/fake_vllm.py): that the proxy relays a chunk before the upstream has sent the
next one, and what the client sees when an upstream breaks off mid-answer, are properties the
real engine cannot show on demand."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest
from sqlalchemy import Engine

from tests.support.fake_vllm import CUT, HOLD, FakeVLLM, Stream, text_chunk
from tests.support.records import export, wait_for_calls


def test_a_chunk_reaches_the_client_before_the_upstream_sends_the_next(
    db_url: str, engine: Engine, start_proxy
) -> None:
    held = Stream(
        [text_chunk("Hello", token_id=7), HOLD, text_chunk(" world", token_id=8, finish="stop")]
    )
    with FakeVLLM(lambda _: held) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        api = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0, timeout=20)
        stream = api.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        received = next(iter(stream))
        # had the proxy buffered, this chunk could not arrive: the upstream is still waiting
        assert received.choices[0].delta.content == "Hello"
        upstream.release()
        assert [c.choices[0].delta.content for c in stream] == [" world"]
    wait_for_calls(engine, 1)
    (call,) = export(engine)[0]["calls"]
    assert call["completion_token_ids"] == [7, 8]
    assert call["status"] == "ok"


def test_upstream_breaking_off_ends_with_an_error_event(db_url: str, engine: Engine, start_proxy):
    # the replica dies mid-answer
    with FakeVLLM(lambda _: Stream([text_chunk("Half", token_id=5), CUT])) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body) as response:
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        error = orjson.loads(lines[-2].removeprefix("data: "))["error"]
        assert error["code"] == "upstream_stream_broken"
        assert upstream.url in error["message"]
        api = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError):
            for _ in api.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "again"}], stream=True
            ):
                pass
    wait_for_calls(engine, 2)
    calls = [c for t in export(engine) for c in t["calls"]]
    assert {c["status"] for c in calls} == {"error"}
    assert all(c["completion_token_ids"] == [5] for c in calls)
    assert all(c["capture_complete"] is False for c in calls)


def test_client_leaving_mid_stream_is_recorded_cancelled_and_hangs_up_upstream(
    db_url: str, engine: Engine, start_proxy
) -> None:
    held = Stream(
        [text_chunk("Hello", token_id=7), HOLD, text_chunk(" never", token_id=8, finish="stop")]
    )
    with FakeVLLM(lambda _: held) as upstream:
        proxy = start_proxy([upstream.url], db_url)
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
        with httpx.Client(timeout=20) as http:
            with http.stream("POST", proxy.url + "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        break  # leave while the upstream still holds the rest
        wait_for_calls(engine, 1, status="cancelled")
        # the proxy stopped the generation upstream instead of letting it run on
        assert upstream.hung_up.wait(20)
    (call,) = export(engine)[0]["calls"]
    assert call["status"] == "cancelled" and call["http_status"] == 499
    assert call["completion_token_ids"] == [7]
    assert call["capture_complete"] is False
