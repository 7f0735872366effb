"""learner.graders.extract: final answers and prompts from every recorded API shape."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from learner.graders.extract import content_text, final_answer, reply_text, task_prompt
from tests.support.trajectories import (
    QUESTION,
    chat_call,
    completions_call,
    failed_call,
    messages_call,
    responses_call,
    trajectory,
)

SHAPES = [chat_call, responses_call, messages_call, completions_call]


@pytest.mark.parametrize("make_call", SHAPES, ids=lambda f: f.__name__)
def test_final_answer_in_every_shape(make_call: Any) -> None:
    assert final_answer(trajectory(make_call("The answer is 42."))) == "The answer is 42."


@pytest.mark.parametrize("make_call", SHAPES, ids=lambda f: f.__name__)
def test_task_prompt_in_every_shape(make_call: Any) -> None:
    assert task_prompt(trajectory(make_call("x"), make_call("y", question="later"))) == QUESTION


def test_the_last_successful_call_decides() -> None:
    assert final_answer(trajectory(chat_call("first"), chat_call("last"))) == "last"
    assert final_answer(trajectory(chat_call("ok"), failed_call())) == "ok"


def test_a_tool_call_only_reply_is_an_empty_answer() -> None:
    assert final_answer(trajectory(chat_call("earlier text"), chat_call(None))) == ""


def test_no_answer_without_a_successful_reply() -> None:
    assert final_answer(trajectory(failed_call())) is None
    assert final_answer(trajectory()) is None
    assert task_prompt(trajectory()) is None


def test_unknown_response_shape() -> None:
    assert reply_text({"something": "else"}) is None
    assert reply_text({"choices": []}) is None


def test_responses_string_input_and_system_first() -> None:
    call = responses_call("x")
    call = replace(call, request={**(call.request or {}), "input": "plain input"})
    assert task_prompt(trajectory(call)) == "plain input"
    chat = chat_call("x")
    asked = chat.request or {}
    system = {"role": "system", "content": "be brief"}
    chat = replace(chat, request={**asked, "messages": [system, *asked["messages"]]})
    assert task_prompt(trajectory(chat)) == QUESTION


def test_content_text_keeps_only_text_parts() -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "output_text", "text": "b"},
    ]
    assert content_text(parts) == "ab"
    assert content_text(None) == "" and content_text("s") == "s"
