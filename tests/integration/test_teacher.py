"""A teacher (`serve --teacher-url`) through the proxy in-process, on SQLite and
PostgreSQL: a second fake vLLM stands for the stronger upstream. The calls it is routed
(by client key, by share of conversations) get its answer through the chat completions
and the Messages APIs and are recorded with `teacher` set and no policy version; every
other call is the served policy's. A teacher that is down or fails leaves its calls to the
served policy; its key is never in the database, the call log or the logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from sqlalchemy import Engine, select

from proxy.base.capture import CHAT
from proxy.base.requests import conversation_key
from proxy.upstream.teacher_assignment import teacher_answers
from store.models import Call
from tests.support.adapter_proxy import admin, settings
from tests.support.fake_vllm import (
    ANSWER,
    CUT,
    TOKEN_IDS,
    WORDS,
    FakeVLLM,
    Stream,
    Whole,
    default_reply,
)
from tests.support.inprocess import BASE, InProcessProxy, in_process_proxy
from tests.support.records import wait_for_calls

SECRET = "sk-teacher-SECRET-4242"
TEACHER_MODEL = "big"
TEACHER_ANSWER = "Teacher: " + ANSWER
HELLO = [{"role": "user", "content": "hi"}]


def teacher_reply(body: dict[str, Any]) -> Whole | Stream:
    """The fake vLLM's answer, its text marked as the teacher's (tokens only where asked)."""
    reply = default_reply(body)
    if isinstance(reply, Whole):
        reply.body["choices"][0]["message"]["content"] = TEACHER_ANSWER
        return reply
    assert isinstance(reply, Stream)
    for step in reply.steps:
        if isinstance(step, dict) and step["choices"]:
            delta = step["choices"][0]["delta"]
            if delta.get("content") == WORDS[0]:
                delta["content"] = "Teacher: " + WORDS[0]
    return reply


@pytest.fixture
def teacher() -> Iterator[FakeVLLM]:
    with FakeVLLM(teacher_reply, model=TEACHER_MODEL, version=None) as upstream:
        yield upstream


def with_teacher(
    student: FakeVLLM, teacher: FakeVLLM, db_url: str, tmp_path: Path, **more: Any
) -> dict[str, Any]:
    return {
        **settings(student, db_url, tmp_path),
        "teacher_url": teacher.url + "/v1",
        "teacher_model": TEACHER_MODEL,
        "teacher_api_key": SECRET,
        **more,
    }


def chat(proxy: InProcessProxy, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=BASE + "/v1", api_key=key, http_client=proxy.http, max_retries=0
    )


def messages(proxy: InProcessProxy, key: str = "none") -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=proxy.app), base_url=BASE, timeout=30
    )
    return anthropic.AsyncAnthropic(base_url=BASE, api_key=key, http_client=http, max_retries=0)


async def new_key(proxy: InProcessProxy, name: str) -> str:
    made = await admin(proxy, "POST", "/keys", json={"name": name})
    assert made.status_code == 201, made.text
    return str(made.json()["key"])


def calls(engine: Engine, n: int) -> list[Any]:
    wait_for_calls(engine, n)
    with engine.connect() as conn:
        return list(conn.execute(select(Call).order_by(Call.started_at)).all())


def secret_nowhere(engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with engine.connect() as conn:
        rows = conn.execute(select(Call)).all()
    assert rows and SECRET not in repr([tuple(r) for r in rows])
    for path in tmp_path.rglob("*"):  # the call log and its rejected rows
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert caplog.records and not [r for r in caplog.records if SECRET in r.getMessage()]
    assert SECRET not in caplog.text


def test_a_teacher_key_gets_the_teachers_answer_in_chat_and_messages(
    fake_vllm: FakeVLLM,
    teacher: FakeVLLM,
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    config = with_teacher(fake_vllm, teacher, db_url, tmp_path, teacher_keys=["alice"])

    async def scenario() -> list[str]:
        async with in_process_proxy(**config) as proxy:
            alice, bob = await new_key(proxy, "alice"), await new_key(proxy, "bob")
            answered = await chat(proxy, alice).chat.completions.create(
                model="fake", messages=HELLO
            )
            assert answered.model == "fake"  # the model it asked for, as with an adapter
            streamed = await chat(proxy, alice).chat.completions.create(
                model="fake", messages=HELLO, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
            reply = await messages(proxy, alice).messages.create(
                model="fake", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
            )
            assert reply.content[0].type == "text"
            other = await chat(proxy, bob).chat.completions.create(model="fake", messages=HELLO)
            anonymous = await messages(proxy).messages.create(
                model="fake", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
            )
            assert anonymous.content[0].type == "text"
            return [
                answered.choices[0].message.content or "",
                text,
                reply.content[0].text,
                other.choices[0].message.content or "",
                anonymous.content[0].text,
            ]

    seen = asyncio.run(scenario())
    assert seen == [TEACHER_ANSWER] * 3 + [ANSWER] * 2
    rows = calls(engine, 5)
    assert [(r.key_name, r.api, r.teacher) for r in rows] == [
        ("alice", "chat.completions", TEACHER_MODEL),
        ("alice", "chat.completions", TEACHER_MODEL),
        ("alice", "messages", TEACHER_MODEL),
        ("bob", "chat.completions", None),
        (None, "messages", None),
    ]
    for row in rows[:3]:
        # no policy version answered it: never an on-policy sample; a vLLM teacher's tokens
        assert row.policy_version is None and row.sampling is None
        assert row.upstream == teacher.url and row.status == "ok"
        assert row.choices[0]["token_ids"] == TOKEN_IDS
    for row in rows[3:]:
        assert row.policy_version == "fake-v1" and row.upstream == fake_vllm.url
    # the teacher got its model and its own key, never a client's key of ours
    assert [r["model"] for r in teacher.requests] == [TEACHER_MODEL] * 3
    assert {h["authorization"] for h in teacher.headers} == {f"Bearer {SECRET}"}
    assert len(fake_vllm.requests) == 2
    assert all(SECRET not in repr(h) for h in fake_vllm.headers)
    secret_nowhere(engine, tmp_path, caplog)


def opening(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"game {i}"}, {"role": "user", "content": "start"}]


def test_a_conversation_chosen_by_share_stays_with_the_teacher_for_every_turn(
    fake_vllm: FakeVLLM, teacher: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    config = with_teacher(fake_vllm, teacher, db_url, tmp_path, teacher_share=0.5)
    games = range(6)
    # which side each conversation is on: a pure function of its opening
    chosen = [
        teacher_answers(
            None,
            conversation_key(None, CHAT, {"messages": opening(i)}) or "",
            keys=frozenset(),
            share=0.5,
        )
        for i in games
    ]
    assert True in chosen and False in chosen  # both sides (fixed by the openings)

    async def scenario() -> None:
        async with in_process_proxy(**config) as proxy:
            client = chat(proxy)
            for turn in range(3):
                for i in games:  # the conversations interleaved
                    history: list[Any] = list(opening(i))
                    for _ in range(turn):
                        history += [
                            {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": "go on"},
                        ]
                    await client.chat.completions.create(model="fake", messages=history)

    asyncio.run(scenario())
    rows = calls(engine, 18)
    by_game: dict[str, set[str | None]] = {}
    for row in rows:
        system = row.request["messages"][0]["content"]
        by_game.setdefault(system, set()).add(row.teacher)
    assert by_game == {f"game {i}": {TEACHER_MODEL if chosen[i] else None} for i in games}
    assert len(teacher.requests) == 3 * sum(chosen)


def test_a_hosted_teacher_is_sent_no_vllm_fields_and_recorded_without_tokens(
    fake_vllm: FakeVLLM, teacher: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    config = with_teacher(
        fake_vllm, teacher, db_url, tmp_path, teacher_share=1.0, teacher_hosted=True
    )

    async def scenario() -> list[str]:
        async with in_process_proxy(**config) as proxy:
            whole = await chat(proxy).chat.completions.create(model="fake", messages=HELLO)
            streamed = await chat(proxy).chat.completions.create(
                model="fake", messages=HELLO, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
            reply = await messages(proxy).messages.create(
                model="fake", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
            )
            return [whole.choices[0].message.content or "", text, reply.content[0].text]

    assert asyncio.run(scenario()) == [TEACHER_ANSWER] * 3
    for sent in teacher.requests:
        assert "return_token_ids" not in sent and "logprobs" not in sent
    rows = calls(engine, 3)
    for row in rows:
        assert row.teacher == TEACHER_MODEL and row.status == "ok"
        # its text is recorded; no token is invented
        assert row.capture_complete is False and row.prompt_len is None
        assert all(c["token_ids"] == [] for c in row.choices or [])
    assert rows[0].response["choices"][0]["message"]["content"] == TEACHER_ANSWER
    assert fake_vllm.requests == []


@pytest.mark.parametrize("fault", ["down", "error"])
def test_a_teacher_that_is_down_or_fails_leaves_its_calls_to_the_served_policy(
    fault: str,
    fake_vllm: FakeVLLM,
    teacher: FakeVLLM,
    db_url: str,
    engine: Engine,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    if fault == "down":
        teacher.down()
    else:  # its error quotes the key it was sent, as some hosted APIs' do
        teacher.reply = lambda body: Whole({"error": {"message": f"bad key {SECRET}"}}, 500)
    config = with_teacher(fake_vllm, teacher, db_url, tmp_path, teacher_share=1.0)

    async def scenario() -> list[str]:
        async with in_process_proxy(**config) as proxy:
            whole = await chat(proxy).chat.completions.create(model="fake", messages=HELLO)
            streamed = await chat(proxy).chat.completions.create(
                model="fake", messages=HELLO, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
            reply = await messages(proxy).messages.create(
                model="fake", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
            )
            return [whole.choices[0].message.content or "", text, reply.content[0].text]

    assert asyncio.run(scenario()) == [ANSWER] * 3
    rows = calls(engine, 3)
    # recorded as the served policy's calls
    assert [(r.teacher, r.policy_version, r.status) for r in rows] == [(None, "fake-v1", "ok")] * 3
    assert any("did not answer" in r.getMessage() for r in caplog.records)
    secret_nowhere(engine, tmp_path, caplog)


def test_a_teacher_that_breaks_off_its_stream_is_recorded_as_its_failed_call(
    fake_vllm: FakeVLLM, teacher: FakeVLLM, db_url: str, engine: Engine, tmp_path: Path
) -> None:
    def broken(body: dict[str, Any]) -> Stream:
        reply = teacher_reply(body)
        assert isinstance(reply, Stream)
        return Stream([*reply.steps[:3], CUT])

    teacher.reply = broken
    config = with_teacher(fake_vllm, teacher, db_url, tmp_path, teacher_share=1.0)

    async def scenario() -> None:
        async with in_process_proxy(**config) as proxy:
            streamed = await chat(proxy).chat.completions.create(
                model="fake", messages=HELLO, stream=True
            )
            with pytest.raises(openai.APIError):
                async for _ in streamed:
                    pass

    asyncio.run(scenario())
    (row,) = calls(engine, 1)
    # what the client was sent before the break is recorded, with who sent it
    assert (row.teacher, row.status, row.http_status) == (TEACHER_MODEL, "error", 502)
    assert row.policy_version is None and fake_vllm.requests == []
