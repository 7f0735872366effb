"""learner.graders.judge_prompt: what the judge sees and how its verdict is read."""

from __future__ import annotations

import json

import pytest

from learner.graders.judge_prompt import (
    DEFAULT_RUBRIC,
    JudgeOutputError,
    Verdict,
    build_messages,
    labels,
    parse_verdict,
    response_format,
)

AB = ["A", "B"]


def test_labels() -> None:
    assert labels(3) == ["A", "B", "C"]
    assert labels(28)[25:] == ["Z", "AA", "AB"]
    assert labels(0) == []


def test_messages_show_rubric_task_and_labelled_answers() -> None:
    system, user = build_messages(
        "What is 6 times 7?", ["42", "41"], rubric=DEFAULT_RUBRIC, max_answer_chars=100
    )
    assert system["role"] == "system" and DEFAULT_RUBRIC in system["content"]
    assert '{"reasoning": "...", "scores": {"A": "0-10", "B": "0-10"}}' in system["content"]
    assert user == {
        "role": "user",
        "content": "Task:\nWhat is 6 times 7?\n\nCandidate A:\n<<<\n42\n>>>\n\n"
        "Candidate B:\n<<<\n41\n>>>",
    }


def test_long_answers_keep_their_end_and_missing_prompt_is_said() -> None:
    _, user = build_messages(None, ["x" * 50 + "END"], rubric="r", max_answer_chars=10)
    assert "the task text is not available" in user["content"]
    assert "[...earlier text cut...]\n" + "x" * 7 + "END\n>>>" in user["content"]


def test_response_format_requires_every_label() -> None:
    fmt = response_format(AB, max_reasoning_chars=300)
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "verdict"
    schema = fmt["json_schema"]["schema"]
    assert list(schema["properties"]) == ["reasoning", "scores"]
    assert schema["properties"]["reasoning"]["maxLength"] == 300
    scores = schema["properties"]["scores"]
    assert scores["required"] == AB and scores["additionalProperties"] is False
    assert scores["properties"]["B"] == {"type": "integer", "minimum": 0, "maximum": 10}
    json.dumps(fmt)  # sent as JSON


@pytest.mark.parametrize(
    "text",
    [
        '{"reasoning": "A is right", "scores": {"A": 10, "B": 3}}',
        'Sure! ```json\n{"scores": {"A": 10, "B": 3}, "reasoning": "A is right"}\n``` done',
        'I compared {them} first. {"reasoning": "A is right", "scores": {"a": "10", " b ": 3.0}}',
        '{"reasoning": "A is right", "scores": {"A": 14, "B": 3, "C": 9}}',  # clamped, extra
    ],
)
def test_parse_verdict_is_robust(text: str) -> None:
    assert parse_verdict(text, AB) == Verdict({"A": 10.0, "B": 3.0}, "A is right")


def test_raw_control_characters_and_odd_whitespace_from_weak_models() -> None:
    text = '{"reasoning"  \t\r\n: "A\x0f\x08 ok", "scores": {"A":\n10 , "B":3}}'
    assert parse_verdict(text, AB) == Verdict({"A": 10.0, "B": 3.0}, "A\x0f\x08 ok")


def test_scores_are_clamped_below_and_reasoning_is_text() -> None:
    verdict = parse_verdict('{"scores": {"A": -2, "B": 5}, "reasoning": ["x"]}', AB)
    assert verdict == Verdict({"A": 0.0, "B": 5.0}, '["x"]')
    assert parse_verdict('{"scores": {"A": 1, "B": 2}}', AB).reasoning == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no json at all", "no JSON object with 'scores'"),
        ('{"reasoning": "cut short", "scores": {"A": 1', "no JSON object with 'scores'"),
        ('{"scores": [1, 2]}', '"scores" is not an object'),
        ('{"scores": {"A": 1}}', "no score for candidate(s) B"),
        ('{"scores": {"A": "high", "B": 1}}', "score of A is not a number"),
        ('{"scores": {"A": true, "B": 1}}', "score of A is not a number"),
        ('{"scores": {"A": NaN, "B": 1}}', "score of A is not finite"),
    ],
)
def test_unusable_verdicts(text: str, message: str) -> None:
    with pytest.raises(JudgeOutputError) as caught:
        parse_verdict(text, AB)
    assert message in str(caught.value)
