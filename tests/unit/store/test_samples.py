"""Samples from recorded tokens: merging, masking, and what breaks a chain."""

from __future__ import annotations

from collections import Counter
from typing import Any

from store.samples import Sampling, build_samples, call_sampling
from store.trajectory_record import Trajectory, TrajectoryCall


def call(prompt: list[int], completion: list[int], **extra: Any) -> TrajectoryCall:
    base = {
        "id": "",
        "api": "completions",
        "status": "ok",
        "capture_complete": True,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "completion_logprobs": [-0.1 * (i + 1) for i in range(len(completion))],
        "finish_reason": "stop",
        "policy_version": "v1",
        "request": {},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
    }
    return TrajectoryCall(**(base | extra))


def test_turns_that_extend_each_other_merge_into_one_sample() -> None:
    trajectory = Trajectory(
        "t",
        (
            call([1, 2], [3, 4]),
            call([1, 2, 3, 4, 5], [6]),  # tool output 5, then the model's 6
        ),
    )
    (sample,) = build_samples(trajectory)
    assert sample.token_ids == [1, 2, 3, 4, 5, 6]
    assert sample.loss_mask == [False, False, True, True, False, True]
    assert sample.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, -0.1]
    assert sample.trained_tokens == 3


def test_a_re_rendered_history_starts_a_new_sample() -> None:
    trajectory = Trajectory(
        "t",
        (call([1, 2], [3, 4]), call([1, 2, 9, 5], [6])),
    )
    first, second = build_samples(trajectory)
    assert first.token_ids == [1, 2, 3, 4]
    assert second.token_ids == [1, 2, 9, 5, 6]
    assert second.loss_mask == [False, False, False, False, True]


def test_incomplete_or_failed_calls_break_the_chain_and_train_nothing() -> None:
    trajectory = Trajectory(
        "t",
        (
            call([1], [2]),
            call([1, 2, 3], [4], capture_complete=False),
            call([1, 2, 3, 4, 5], [6]),
            call([7], [8], status="error"),
        ),
    )
    first, second = build_samples(trajectory)
    assert first.token_ids == [1, 2]
    # call 2's tokens are unknown to the trainer, so call 3 cannot extend across them
    assert second.token_ids == [1, 2, 3, 4, 5, 6] and second.trained_tokens == 1


def test_different_sampling_parameters_never_share_a_sample() -> None:
    trajectory = Trajectory(
        "t",
        (
            call([1], [2], sampling={"temperature": 0.7}),
            call([1, 2, 3], [4], sampling={"temperature": 1.0}),
        ),
    )
    first, second = build_samples(trajectory)
    assert first.sampling == Sampling(temperature=0.7)
    assert second.sampling == Sampling(temperature=1.0)


def test_truncation_and_whether_a_cut_reply_came_before_the_last() -> None:
    (sample,) = build_samples(Trajectory("t", (call([1], [2], finish_reason="length"),)))
    assert sample.truncated and not sample.cut_before_last  # the graded reply itself
    cut_then_retried = Trajectory(
        "t",
        (call([1], [2], finish_reason="length"), call([1, 2, 5], [6])),
    )
    (merged,) = build_samples(cut_then_retried)
    assert merged.truncated and merged.cut_before_last
    whole_then_cut = Trajectory(
        "t",
        (call([1], [2]), call([1, 2, 5], [6], finish_reason="length")),
    )
    (last_cut,) = build_samples(whole_then_cut)
    assert last_cut.truncated and not last_cut.cut_before_last


def test_the_recorded_effective_sampling_is_what_is_reproduced() -> None:
    recorded = {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.05,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    assert call_sampling(call([1], [2], sampling=recorded)) == Sampling(
        0.7, 0.8, 20, repetition_penalty=1.05
    )
    # greedy: vLLM reports the penalised logits' plain logprobs
    greedy = call_sampling(call([1], [2], sampling={**recorded, "temperature": 0.0}))
    assert greedy == Sampling(repetition_penalty=1.05)
    assert greedy.penalised


def test_calls_the_trainer_cannot_reproduce_are_skipped_and_counted() -> None:
    skipped: Counter[str] = Counter()
    trajectory = Trajectory(
        "t",
        (
            call([1], [2], sampling=None),  # the replica's defaults were unknown
            call([1, 2, 3], [4], sampling={"temperature": 1.0, "constraints": ["logit_bias"]}),
            call([5], [6], status="error"),
            call([7], [8]),
        ),
    )
    (sample,) = build_samples(trajectory, skipped=skipped)
    assert sample.token_ids == [7, 8]
    assert skipped == {"sampling unknown": 1, "logit_bias": 1, "failed": 1}


def test_each_call_s_completion_is_where_its_penalties_count_output() -> None:
    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 5], [6])]
    (sample,) = build_samples(Trajectory("t", tuple(calls)))
    assert sample.completions == [(2, 4), (5, 6)]


def test_a_call_a_teacher_answered_is_never_trained_and_counted() -> None:
    # even captured token-exact with a known version: its tokens are another model's
    trajectory = Trajectory(
        "t",
        (
            call([1], [2]),
            call([1, 2, 3], [4], teacher="big-model"),
            call([1, 2, 3, 4, 5], [6]),
        ),
    )
    skipped: Counter[str] = Counter()
    first, second = build_samples(trajectory, skipped=skipped)
    assert skipped == {"teacher answered": 1}
    assert first.token_ids == [1, 2]
    assert second.token_ids == [1, 2, 3, 4, 5, 6] and second.loss_mask[3] is False
    assert second.trained_tokens == 1
