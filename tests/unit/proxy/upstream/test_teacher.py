"""The teacher (`serve --teacher-url`): which calls it answers (pure), what it is sent, and
its settings' checks."""

from __future__ import annotations

import re

import orjson
import pytest

from proxy.base.capture import CHAT, prepare_upstream_body
from proxy.settings import Settings
from proxy.upstream.teacher import Teacher
from proxy.upstream.teacher_assignment import teacher_answers

NONE: frozenset[str] = frozenset()


def test_a_listed_key_always_goes_to_the_teacher() -> None:
    keys = frozenset({"alice"})
    assert all(teacher_answers("alice", f"m:{i}", keys=keys, share=0.0) for i in range(50))
    assert not any(teacher_answers("bob", f"m:{i}", keys=keys, share=0.0) for i in range(50))
    assert not teacher_answers(None, "m:1", keys=keys, share=0.0)


def test_a_share_splits_conversations_in_proportion_and_each_always_alike() -> None:
    conversations = [f"m:{i}" for i in range(4000)]
    chosen = [c for c in conversations if teacher_answers(None, c, keys=NONE, share=0.25)]
    assert 0.22 < len(chosen) / len(conversations) < 0.28
    # the same conversation key: the same side, on every call of it
    again = [c for c in conversations if teacher_answers("k", c, keys=NONE, share=0.25)]
    assert again == chosen


def test_the_share_bounds() -> None:
    assert all(teacher_answers(None, f"s:{i}", keys=NONE, share=1.0) for i in range(50))
    assert not any(teacher_answers(None, f"s:{i}", keys=NONE, share=0.0) for i in range(50))


def teacher(**settings: object) -> Teacher:
    base: dict[str, object] = {
        "teacher_url": "https://teacher.example/v1/",
        "teacher_model": "big",
        "teacher_share": 0.5,
    }
    return Teacher(Settings(**{**base, **settings}))


def test_a_vllm_teacher_gets_the_call_as_the_policy_would_for_its_model() -> None:
    body, asked = prepare_upstream_body(
        CHAT, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_k": 5}
    )
    sent = orjson.loads(teacher().body(body, asked))
    assert sent == {**body, "model": "big"}
    assert sent["return_token_ids"] is True and sent["logprobs"] is True


def test_a_hosted_teacher_gets_no_vllm_fields() -> None:
    body, asked = prepare_upstream_body(
        CHAT,
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "top_k": 5,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    sent = orjson.loads(teacher(teacher_hosted=True).body(body, asked))
    for name in ("return_token_ids", "logprobs", "top_k", "chat_template_kwargs"):
        assert name not in sent
    assert sent["model"] == "big" and sent["stream_options"] == {"include_usage": True}
    # logprobs the client asked for itself stay
    body, asked = prepare_upstream_body(
        CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    )
    assert orjson.loads(teacher(teacher_hosted=True).body(body, asked))["logprobs"] is True


def test_the_teacher_gets_its_own_key_and_never_the_clients() -> None:
    assert teacher().headers() == {"Content-Type": "application/json"}
    keyed = teacher(teacher_api_key="sk-teacher")
    assert keyed.headers()["Authorization"] == "Bearer sk-teacher"
    assert "sk-teacher" not in repr(Settings(teacher_api_key="sk-teacher"))
    assert keyed.replica.url == "https://teacher.example"


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"teacher_share": 0.5}, "need --teacher-url"),
        ({"teacher_model": "big"}, "need --teacher-url"),
        ({"teacher_url": "http://t", "teacher_share": 0.5}, "needs --teacher-model"),
        ({"teacher_url": "http://t", "teacher_model": "big"}, "answers nothing"),
        ({"teacher_url": "ftp://t", "teacher_model": "b", "teacher_share": 1}, "http(s)"),
        (
            {"teacher_url": "https://u:pw@t", "teacher_model": "b", "teacher_keys": ["a"]},
            "must not hold credentials",
        ),
    ],
)
def test_teacher_settings_that_do_not_hang_together_are_refused(
    settings: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as refused:
        Settings(**settings).check_teacher()
    assert "pw" not in str(refused.value)


def test_teacher_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_TEACHER_URL", "http://t:9000/v1")
    monkeypatch.setenv("ONTHEJOB_TEACHER_MODEL", "big")
    monkeypatch.setenv("ONTHEJOB_TEACHER_KEYS", "alice, bob")
    monkeypatch.setenv("ONTHEJOB_TEACHER_API_KEY", "sk-env")
    settings = Settings()
    settings.check_teacher()
    assert settings.teacher_url == "http://t:9000" and settings.teacher_keys == ["alice", "bob"]
    assert settings.teacher_api_key is not None
    assert settings.teacher_api_key.get_secret_value() == "sk-env"
    with pytest.raises(ValueError, match="between 0 and 1"):
        Settings(teacher_share=1.5)
