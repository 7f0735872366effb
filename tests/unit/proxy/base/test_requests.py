"""proxy.base.requests: parsing and checking client bodies, and the conversation key."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.base.capture import CHAT, COMPLETIONS
from proxy.base.errors import BadRequest
from proxy.base.requests import check_generation, conversation_key, parse_object

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is 2+2?"}
REPLY = {"role": "assistant", "content": "4"}
NEXT = {"role": "user", "content": "And 3+3?"}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "invalid_json"),
        (b" \n\t", "invalid_json"),
        (b'{"model": ', "invalid_json"),
        (b"{'model': 'm'}", "invalid_json"),
        (b"[1, 2]", "invalid_body"),
        (b'"text"', "invalid_body"),
        (b"null", "invalid_body"),
    ],
)
def test_parse_object_refuses(raw: bytes, code: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_object(raw)

    assert caught.value.code == code
    assert caught.value.status == 400
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


def test_parse_object_names_the_wrong_type() -> None:
    with pytest.raises(BadRequest, match="not list"):
        parse_object(b"[]")


def test_parse_object_returns_the_object() -> None:
    assert parse_object(b' {"model": "m", "n": 2} ') == {"model": "m", "n": 2}


@pytest.mark.parametrize(
    ("api", "body", "param", "code"),
    [
        (CHAT, {"model": "m"}, "messages", "missing_required"),
        (CHAT, {"messages": None}, "messages", "missing_required"),
        (CHAT, {"messages": []}, "messages", "invalid_type"),
        (CHAT, {"messages": "hi"}, "messages", "invalid_type"),
        (CHAT, {"messages": [USER], "stream": "true"}, "stream", "invalid_type"),
        (CHAT, {"messages": [USER], "stream": 1}, "stream", "invalid_type"),
        (COMPLETIONS, {"model": "m"}, "prompt", "missing_required"),
        (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream", "invalid_type"),
    ],
)
def test_check_generation_refuses(api: str, body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(BadRequest) as caught:
        check_generation(api, body)

    assert (caught.value.param, caught.value.code) == (param, code)


@pytest.mark.parametrize(
    ("api", "body"),
    [
        (CHAT, {"messages": [USER]}),
        (CHAT, {"messages": [USER], "stream": True}),
        (CHAT, {"messages": [USER], "stream": None}),
        (COMPLETIONS, {"prompt": ""}),
        (COMPLETIONS, {"prompt": [1, 2], "stream": False}),
    ],
)
def test_check_generation_accepts(api: str, body: dict[str, Any]) -> None:
    check_generation(api, body)


def test_conversation_key_follows_the_opening_messages() -> None:
    opening = conversation_key(None, CHAT, {"messages": [SYSTEM, USER]})

    assert opening is not None and opening.startswith("m:")
    assert conversation_key(None, CHAT, {"messages": [SYSTEM, USER, REPLY, NEXT]}) == opening
    assert conversation_key(None, CHAT, {"messages": [SYSTEM, USER]}) == opening


@pytest.mark.parametrize(
    "messages",
    [
        [SYSTEM, NEXT],
        [{"role": "system", "content": "You are verbose."}, USER],
        [USER],
        [USER, SYSTEM],
    ],
)
def test_conversation_key_differs_for_other_openings(messages: list[dict[str, Any]]) -> None:
    assert conversation_key(None, CHAT, {"messages": messages}) != conversation_key(
        None, CHAT, {"messages": [SYSTEM, USER]}
    )


def test_conversation_key_of_completions_follows_the_prompt() -> None:
    key = conversation_key(None, COMPLETIONS, {"prompt": "Once upon"})

    assert key == conversation_key(None, COMPLETIONS, {"prompt": "Once upon", "max_tokens": 5})
    assert key != conversation_key(None, COMPLETIONS, {"prompt": "Once upon a"})


def test_session_wins_over_messages() -> None:
    assert conversation_key("abc", CHAT, {"messages": [SYSTEM, USER]}) == "s:abc"
    assert conversation_key("abc", CHAT, {"messages": [NEXT]}) == "s:abc"
    assert conversation_key("abc", COMPLETIONS, {"prompt": "x"}) == "s:abc"


def test_unserialisable_opening_has_no_conversation_key() -> None:
    assert conversation_key(None, COMPLETIONS, {"prompt": {1, 2}}) is None


@pytest.mark.parametrize("prefix", [[], [SYSTEM]], ids=["no system prompt", "system prompt"])
def test_every_call_of_a_conversation_has_its_opening_as_key(prefix: list) -> None:
    # without a system prompt the first two messages hold the first reply, which the first
    # call does not: the opening stops at the first user message
    first = conversation_key(None, CHAT, {"messages": [*prefix, USER]})
    later = conversation_key(None, CHAT, {"messages": [*prefix, USER, REPLY, NEXT]})
    other = conversation_key(None, CHAT, {"messages": [*prefix, NEXT]})
    assert first is not None and first.startswith("m:")
    assert first == later != other


def test_the_session_wins_and_a_call_without_an_opening_has_no_key() -> None:
    assert conversation_key("abc", CHAT, {"messages": [USER]}) == "s:abc"
    assert conversation_key(None, CHAT, {"messages": [SYSTEM]}) is None
    assert conversation_key(None, CHAT, {"messages": "not a list"}) is None
    assert conversation_key(None, CHAT, {}) is None
    prompt = conversation_key(None, COMPLETIONS, {"prompt": "2 + 2 ="})
    assert prompt is not None
    assert prompt == conversation_key(None, COMPLETIONS, {"prompt": "2 + 2 ="})
