"""The learning rate scaled to how far a step moves the policy (learner/step_size.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from learner.step_size import (
    MIN_SCALE,
    MIN_TOKENS,
    StepSize,
    describe,
    measured_from,
    recorded_scale,
)
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample


def test_a_step_that_moved_too_far_shrinks_the_next_and_one_within_the_target_keeps_it() -> None:
    size = StepSize(0.02)
    size.observe(0.02 * 4 * 100, 100)  # 4x the target: KL ~ lr^2, so half the rate
    assert math.isclose(size.scale, 0.5)
    size.observe(0.005 * 100, 100)  # a quarter of the target: doubled, never above 1
    assert size.scale == 1.0
    size.observe(0.001 * 100, 100)
    assert size.scale == 1.0 and size.last_movement == pytest.approx(0.001)


def test_one_measure_never_swings_the_scale_by_more_than_its_bounds() -> None:
    size = StepSize(0.02)
    size.observe(50.0 * 100, 100)  # a collapse-sized step: shrunk by at most 4
    assert size.scale == 0.25
    for _ in range(10):
        size.observe(50.0 * 100, 100)
    assert size.scale == MIN_SCALE
    size.observe(1e-9 * 100, 100)  # a still step: grows by at most 2
    assert size.scale == 2 * MIN_SCALE


def test_no_measure_where_too_few_tokens_or_none_finite_and_off_at_zero() -> None:
    size = StepSize(0.02)
    size.observe(100.0, MIN_TOKENS - 1)
    size.observe(float("nan"), 100)
    assert size.scale == 1.0 and size.last_movement is None
    off = StepSize(0.0)
    off.observe(100.0, 100)
    assert off.learning_rate(5e-5) == 5e-5


def test_a_measure_goes_on_from_the_scale_the_measured_step_took_as_recorded() -> None:
    restarted = StepSize(0.02)  # a new trainer: 1, where the recorded step took 1/8
    restarted.follow(0.125, 0.02 * 100, 100)  # that step moved it by the target
    assert restarted.scale == 0.125
    restarted.follow(None, 0.08 * 100, 100)  # nothing recorded: from its own
    assert restarted.scale == 0.0625
    restarted.follow(0.125, 0.0, 0)  # no measure: the recorded scale all the same
    assert restarted.scale == 0.125 and restarted.last_movement is None


def test_the_scale_settles_where_a_step_moves_the_policy_by_the_target() -> None:
    size = StepSize(0.02)
    for _ in range(12):  # a model where a step at the full rate moves it 0.5 nats a token
        size.observe(0.5 * size.scale**2 * 1000, 1000)
    assert math.isclose(0.5 * size.scale**2, 0.02, rel_tol=0.05)


def test_the_step_line_says_the_rate_used_and_why() -> None:
    assert describe(5e-5, 5e-5, 0.0, None) == "lr 5e-05"
    assert describe(5e-5, 5e-5, 0.02, None) == (
        "lr 5e-05 (no measure of the last step; --step-kl 0.02)"
    )
    assert describe(1.25e-5, 5e-5, 0.02, 0.44) == (
        "lr 1.25e-05 (x0.25 of 5e-05, the last step moved the policy 4.40e-01 nats a token; "
        "--step-kl 0.02)"
    )


def _version(name: str, scale: float | None, tenant: str | None = None) -> dict:
    metrics = {} if scale is None else {"step_scale": scale}
    return {"version": name, "metrics": metrics, "tenant": tenant}


def test_versions_count_back_while_each_step_after_them_was_a_grpo_step_of_the_lineage() -> None:
    # v3 <- v2 <- v1 <- v0 (the trainer's version first): v1's record lacks a scale (a
    # rollback, the supervised stage), so the chain ends at its parent. v2's samples moved
    # by the last step alone (share 1); v1's by it (scale 0.5) and the one before (0.25):
    # KL adds up as the squares, the last step's share 0.25 / (0.25 + 0.0625)
    chain = [_version("v3", 0.5), _version("v2", 0.25), _version("v1", None), _version("v0", 1)]
    assert measured_from(chain, None) == pytest.approx({"v2": 1.0, "v1": 0.8})
    assert measured_from(chain[:1], None) == {}
    assert measured_from([_version("v3", 0.5), _version("v2", 1)], "t") == {}  # not t's step
    tenant = [_version("t-2", 0.5, "t"), _version("t-1", 1, "t"), _version("base", 1)]
    assert measured_from(tenant, "t") == pytest.approx({"t-1": 1.0, "base": 0.2})
    assert recorded_scale(tenant[0], "t") == 0.5 and recorded_scale(tenant[2], "t") is None


def test_equal_steps_share_an_old_version_s_kl_equally() -> None:
    chain = [_version(f"v{i}", 0.5) for i in range(4, -1, -1)]
    assert measured_from(chain, None) == pytest.approx(
        {"v3": 1, "v2": 1 / 2, "v1": 1 / 3, "v0": 1 / 4}
    )


def _sampled(trainer: Trainer, version: str) -> Sample:
    prompt, completion = [1, 10, 20, 30], [40, 50, 60, 70, 80, 90, 100, 110, 120, 130]
    return Sample(
        trajectory_id=f"t-{version}",
        token_ids=prompt + completion,
        loss_mask=[False] * len(prompt) + [True] * len(completion),
        logprobs=[0.0] * len(prompt) + trainer.logprobs_of(prompt, completion),
        policy_versions={version},
    )


@pytest.mark.parametrize("step_kl", [0.02, 0.0])
def test_the_trainer_measures_the_last_steps_move_on_its_samples_and_scales_this_one(
    step_kl: float, tmp_path: Path
) -> None:
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-2, step_kl=step_kl), "cpu")
    # two samples v0 produced: more than MIN_TOKENS trained tokens between them
    before = [
        _sampled(trainer, "v0"),
        dataclasses.replace(_sampled(trainer, "v0"), trajectory_id="u"),
    ]
    first = trainer.step(before, [1.0, 1.0], fresh_version="v0")
    assert first["learning_rate_used"] == 1e-2 and "movement_kl" not in first
    # what that step moved the policy on v0's tokens, by hand
    completion = before[0].token_ids[4:]
    now = torch.tensor(
        trainer.logprobs_of(before[0].token_ids[:4], completion), dtype=torch.float64
    )
    then = torch.tensor(before[0].logprobs[4:], dtype=torch.float64)
    moved = float((now - then).exp().sub(1).sub(now - then).mean())
    second = trainer.step(
        [*before, _sampled(trainer, "v1")],
        [1.0, -1.0, 1.0],
        fresh_version="v1",
        previous_versions={"v0": 1.0},
        previous_scale=1.0,
    )
    assert second["movement_tokens"] == 20
    assert second["movement_kl"] == pytest.approx(moved, rel=1e-3)
    assert moved > 0.08  # lr 1e-2 moves this model far: 4x the target or more
    expected = 1e-2 if step_kl == 0 else 1e-2 * max(0.25, math.sqrt(0.02 / moved))
    assert second["learning_rate_used"] == pytest.approx(expected, rel=1e-3)
    assert second["step_scale"] == pytest.approx(expected / 1e-2, rel=1e-3)
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-2  # the most, for the next


def test_a_step_whose_every_sequence_was_dropped_still_measures_the_last_one(
    tmp_path: Path,
) -> None:
    """The sequences the last step moved most are the ones dropped as mismatched: their
    measure must not go with them."""
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    config = TrainerConfig(learning_rate=1e-2, step_kl=0.02, max_sequence_mismatch=1e-9)
    trainer = Trainer(model, config, "cpu")
    far = [_sampled(trainer, "v0"), dataclasses.replace(_sampled(trainer, "v0"), trajectory_id="u")]
    far = [dataclasses.replace(s, logprobs=[lp - 1.0 for lp in s.logprobs]) for s in far]
    metrics = trainer.step(far, [1.0, 1.0], previous_versions={"v0": 1.0}, previous_scale=1.0)
    assert metrics.get("skipped") == "all sequences dropped"
    assert trainer.step_size.last_movement is not None and trainer.step_size.scale == 0.25


def test_a_version_s_samples_count_its_share_of_their_kl_to_the_measure(tmp_path: Path) -> None:
    """A sample of a version two equal steps back: the last step's share of its KL is a
    half. Samples of versions not named are not measured."""
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m", seed=0))
    trainer = Trainer(model, TrainerConfig(learning_rate=1e-2, step_kl=0.02), "cpu")
    before = [
        _sampled(trainer, "v0"),
        dataclasses.replace(_sampled(trainer, "v0"), trajectory_id="u"),
    ]
    trainer.step(before, [1.0, 1.0], fresh_version="v0")
    prompt, completion = before[0].token_ids[:4], before[0].token_ids[4:]
    now = torch.tensor(trainer.logprobs_of(prompt, completion), dtype=torch.float64)
    then = torch.tensor(before[0].logprobs[4:], dtype=torch.float64)
    moved = float((now - then).exp().sub(1).sub(now - then).mean())
    second = trainer.step(
        [*before, _sampled(trainer, "v9")],
        [1.0, -1.0, 1.0],
        previous_versions={"v0": 0.5},
        previous_scale=1.0,
    )
    assert second["movement_tokens"] == 20  # v9's sample: not a version named
    assert second["movement_kl"] == pytest.approx(moved / 2, rel=1e-3)
