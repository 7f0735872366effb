"""The sampling parameters vLLM applies: the request's, else the replica's defaults."""

from __future__ import annotations

from proxy.upstream.sampling import NEUTRAL, effective

QWEN = {**NEUTRAL, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def test_the_request_wins_then_the_defaults_then_neutral() -> None:
    got = effective({"temperature": 1.0, "top_k": None}, QWEN)
    assert got == {**QWEN, "temperature": 1.0}
    assert effective({"top_p": 0.5}, {"temperature": 0.6}) == {
        **NEUTRAL,
        "temperature": 0.6,
        "top_p": 0.5,
    }


def test_unknown_defaults_record_nothing() -> None:
    assert effective({"temperature": 1.0}, None) is None


def test_greedy_drops_the_filters_but_keeps_the_penalties() -> None:
    got = effective({"temperature": 0}, QWEN)
    assert got == {**QWEN, "temperature": 0, "top_p": 1.0, "top_k": 0}


def test_other_logits_processing_is_named() -> None:
    body = {
        "logit_bias": {"5": 10},
        "response_format": {"type": "json_object"},
        "tool_choice": "required",
        "min_tokens": 3,
    }
    assert effective(body, NEUTRAL)["constraints"] == [
        "logit_bias",
        "min_tokens",
        "response_format",
        "tool_choice",
    ]
    plain = {"response_format": {"type": "text"}, "tool_choice": "auto", "min_tokens": 0}
    assert "constraints" not in effective(plain, NEUTRAL)
