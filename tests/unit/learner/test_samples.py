"""Samples from recorded tokens: merging, masking, and what breaks a chain."""

from __future__ import annotations

from typing import Any

from learner.samples import Sampling, build_samples, call_sampling


def call(prompt: list[int], completion: list[int], **extra: Any) -> dict[str, Any]:
    base = {
        "status": "ok",
        "capture_complete": True,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": [-0.1 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
        "policy_version": "v1",
        "request": {},
    }
    return base | extra


def test_turns_that_extend_each_other_merge_into_one_sample() -> None:
    trajectory = {
        "id": "t",
        "calls": [
            call([1, 2], [3, 4]),
            call([1, 2, 3, 4, 5], [6]),  # tool output 5, then the model's 6
        ],
    }
    (sample,) = build_samples(trajectory)
    assert sample.token_ids == [1, 2, 3, 4, 5, 6]
    assert sample.loss_mask == [False, False, True, True, False, True]
    assert sample.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.1]
    assert sample.trained_tokens == 3


def test_a_re_rendered_history_starts_a_new_sample() -> None:
    trajectory = {
        "id": "t",
        "calls": [call([1, 2], [3, 4]), call([1, 2, 9, 5], [6])],
    }
    first, second = build_samples(trajectory)
    assert first.token_ids == [1, 2, 3, 4]
    assert second.token_ids == [1, 2, 9, 5, 6]
    assert second.loss_mask == [False, False, False, False, True]


def test_incomplete_or_failed_calls_break_the_chain_and_train_nothing() -> None:
    trajectory = {
        "id": "t",
        "calls": [
            call([1], [2]),
            call([1, 2, 3], [4], capture_complete=False),
            call([1, 2, 3, 4, 5], [6]),
            call([7], [8], status="error"),
        ],
    }
    first, second = build_samples(trajectory)
    assert first.token_ids == [1, 2]
    # call 2's tokens are unknown to the trainer, so call 3 cannot extend across them
    assert second.token_ids == [1, 2, 3, 4, 5, 6] and second.trained_tokens == 1


def test_different_sampling_parameters_never_share_a_sample() -> None:
    trajectory = {
        "id": "t",
        "calls": [
            call([1], [2], request={"temperature": 0.7}),
            call([1, 2, 3], [4], request={"temperature": 1.0}),
        ],
    }
    first, second = build_samples(trajectory)
    assert first.sampling == Sampling(temperature=0.7)
    assert second.sampling == Sampling(temperature=1.0)


def test_truncation_and_defaults() -> None:
    (sample,) = build_samples({"id": "t", "calls": [call([1], [2], finish_reason="length")]})
    assert sample.truncated
    defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert call_sampling({"top_k": 5}, defaults) == Sampling(0.6, 0.9, 5)
