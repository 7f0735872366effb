"""learner.loss: the clipped, truncated, token-normalised policy-gradient loss, clipped
against the behaviour policy or (the default) against the proximal one."""

from __future__ import annotations

import math

import pytest
import torch

from learner.loss import LossBatch, LossConfig, policy_loss, sequence_mismatch

# clip band [0.8, 1.28] against the behaviour policy, importance weight cap 2.0: the
# hand-computed cases below; the default, clipped against the proximal policy, further down
CONFIG = LossConfig(clip_against="behaviour")
PROXIMAL = LossConfig()


def _batch(
    ratios: list[list[float]],
    advantages: list[float],
    mask: list[list[bool]] | None = None,
    ref_log_ratios: list[list[float]] | None = None,
) -> LossBatch:
    """Behaviour logprobs are an arbitrary -1.5; current = behaviour + log(ratio), so each
    token's importance ratio is exactly the number written in the test."""
    behaviour = torch.full((len(ratios), len(ratios[0])), -1.5, dtype=torch.float64)
    logprobs = (behaviour + torch.tensor(ratios, dtype=torch.float64).log()).requires_grad_()
    ref = None
    if ref_log_ratios is not None:
        ref = logprobs.detach() + torch.tensor(ref_log_ratios, dtype=torch.float64)
    return LossBatch(
        logprobs=logprobs,
        behaviour_logprobs=behaviour,
        advantages=torch.tensor(advantages, dtype=torch.float64),
        loss_mask=torch.tensor(mask) if mask is not None else torch.ones_like(behaviour).bool(),
        ref_logprobs=ref,
    )


def _grad(batch: LossBatch, loss: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, batch.logprobs)
    return grad


# -- hand-computed values ------------------------------------------------------------------


def test_positive_advantage_hand_computed() -> None:
    # A = +1, ratios 1.1 and 0.5, third token masked, N = 2 trained tokens.
    #   token 0: min(1.1 * 1, clip(1.1) * 1) = min(1.1, 1.1) = 1.1
    #   token 1: min(0.5 * 1, clip(0.5) * 1) = min(0.5, 0.8) = 0.5  (unclipped: A > 0, r low)
    #   loss = -(1.1 + 0.5) / 2 = -0.8
    # gradients d loss / d logprob = -(r * A) / N: -0.55, -0.25, masked 0.
    batch = _batch([[1.1, 0.5, 7.0]], [1.0], [[True, True, False]])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=2)

    assert loss.item() == pytest.approx(-0.8)
    assert _grad(batch, loss)[0].tolist() == pytest.approx([-0.55, -0.25, 0.0])
    assert metrics["tokens"] == 2.0
    assert metrics["clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx(0.8)  # (1.1 + 0.5) / 2
    assert metrics["ratio_min"] == pytest.approx(0.5)
    assert metrics["ratio_max"] == pytest.approx(1.1)


def test_negative_advantage_hand_computed() -> None:
    # A = -2, ratios 1.5, 0.5, 3.0, N = 3.
    #   token 0: w = 1.5; min(1.5 * -2, 1.28 * -2) = min(-3.0, -2.56) = -3.0    (unclipped)
    #   token 1: w = 0.5; min(0.5 * -2, 0.8 * -2)  = min(-1.0, -1.6)  = -1.6    (clipped)
    #   token 2: w = min(3, 2) = 2; min(2 * -2, 1.28 * -2) = min(-4.0, -2.56) = -4.0 (truncated)
    #   loss = -(-3.0 - 1.6 - 4.0) / 3 = 8.6 / 3
    # gradients -(w * A) / N: token 0: 3/3 = 1, token 1: clipped -> 0, token 2: 4/3.
    batch = _batch([[1.5, 0.5, 3.0]], [-2.0])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=3)

    assert loss.item() == pytest.approx(8.6 / 3)
    assert _grad(batch, loss)[0].tolist() == pytest.approx([1.0, 0.0, 4 / 3])
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["truncated_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(5 / 3)  # (1.5 + 0.5 + 3) / 3
    assert metrics["ratio_max"] == pytest.approx(3.0)
    # weights 1.5, 0.5, 2: mean 4/3; deviations 1/6, -5/6, 2/3 -> var (1 + 25 + 16) / 36 / 3
    assert metrics["importance_weight_mean"] == pytest.approx(4 / 3)
    assert metrics["importance_weight_std"] == pytest.approx(math.sqrt(42 / 108))
    # k3 = r - 1 - log r per token, averaged
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 3.0)]
    assert metrics["mismatch_kl"] == pytest.approx(sum(k3) / 3)


def test_metrics_are_python_floats() -> None:
    batch = _batch([[1.0, 2.5]], [1.0], ref_log_ratios=[[0.1, 0.2]])
    _, metrics = policy_loss(batch, CONFIG, total_tokens=2)

    assert all(type(value) is float for value in metrics.values())
    assert set(metrics) >= {"clip_fraction", "ratio_mean", "ratio_min", "ratio_max"}
    assert set(metrics) >= {"importance_weight_mean", "importance_weight_std", "mismatch_kl"}
    assert set(metrics) >= {"kl", "tokens"}


# -- gradient sign ---------------------------------------------------------------------------


@pytest.mark.parametrize("advantage", [1.0, -1.0, 0.5, -3.0])
def test_gradient_moves_sampled_token_with_advantage(advantage: float) -> None:
    # Fresh on-policy token (r = 1, unclipped): gradient descent on the loss must raise the
    # logprob of a token with A > 0 (d loss / d logprob < 0) and lower it for A < 0.
    batch = _batch([[1.0]], [advantage])
    loss, _ = policy_loss(batch, CONFIG, total_tokens=1)

    grad = _grad(batch, loss).item()
    assert grad == pytest.approx(-advantage)
    assert math.copysign(1.0, grad) == -math.copysign(1.0, advantage)


def test_zero_advantage_gives_no_gradient() -> None:
    batch = _batch([[0.7, 1.0, 1.9]], [0.0])
    loss, _ = policy_loss(batch, CONFIG, total_tokens=3)

    assert loss.item() == 0.0
    assert _grad(batch, loss).abs().sum().item() == 0.0


# -- masking ---------------------------------------------------------------------------------


def test_masked_tokens_neither_change_the_loss_nor_get_gradient() -> None:
    mask = [[True, False, True, False]]
    batch = _batch([[1.1, 1.0, 0.9, 1.0]], [1.0], mask)
    # Garbage where the mask is off: prompt positions may hold -inf, nan or anything.
    garbage_logprobs = batch.logprobs.detach().clone()
    garbage_logprobs[0, 1] = float("nan")
    garbage_behaviour = batch.behaviour_logprobs.clone()
    garbage_behaviour[0, 3] = float("-inf")
    garbage = LossBatch(
        logprobs=garbage_logprobs.requires_grad_(),
        behaviour_logprobs=garbage_behaviour,
        advantages=batch.advantages,
        loss_mask=batch.loss_mask,
        ref_logprobs=garbage_behaviour,
    )
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=2)
    garbage_loss, garbage_metrics = policy_loss(garbage, CONFIG, total_tokens=2)

    # -(1.1 + 0.9) / 2: only the two trained tokens count.
    assert loss.item() == pytest.approx(-1.0)
    assert garbage_loss.item() == pytest.approx(-1.0)
    grad = _grad(garbage, garbage_loss)
    assert grad[0, 1].item() == 0.0 and grad[0, 3].item() == 0.0
    assert torch.isfinite(grad).all()
    assert garbage_metrics["ratio_max"] == pytest.approx(metrics["ratio_max"])


def test_empty_mask_is_a_zero_loss_with_neutral_metrics() -> None:
    batch = _batch([[1.4, 0.6]], [1.0], [[False, False]])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=5)

    assert loss.item() == 0.0
    assert _grad(batch, loss).abs().sum().item() == 0.0
    assert metrics["tokens"] == 0.0
    assert metrics["ratio_mean"] == 1.0 and metrics["mismatch_kl"] == 0.0


# -- clipping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped"),
    [
        (1.27, 1.0, False),  # inside the band
        (1.29, 1.0, True),  # above 1 + 0.28 with A > 0: clip-higher binds
        (0.79, 1.0, False),  # below the band, but A > 0 wants r up: unclipped
        (0.81, -1.0, False),  # inside the band
        (0.79, -1.0, True),  # below 1 - 0.2 with A < 0: clip binds
        (1.29, -1.0, False),  # above the band, but A < 0 wants r down: unclipped
        (1.21, 1.0, False),  # 1 + 0.2 is NOT the upper bound: clip-higher is asymmetric
    ],
)
def test_clipping_is_active_exactly_outside_the_band(
    ratio: float, advantage: float, clipped: bool
) -> None:
    batch = _batch([[ratio]], [advantage])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=1)

    grad = _grad(batch, loss).item()
    assert metrics["clip_fraction"] == (1.0 if clipped else 0.0)
    # Clipped: the objective is the constant clip(r) * A, so no gradient; else -r * A.
    assert grad == pytest.approx(0.0 if clipped else -ratio * advantage)
    bound = min(max(ratio, 0.8), 1.28)
    objective = min(ratio * advantage, bound * advantage)
    assert loss.item() == pytest.approx(-objective)


# -- truncation ------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [5.0, 50.0, 1e30])
def test_importance_weight_is_truncated_at_the_cap(ratio: float) -> None:
    # A = -1 and r past the cap 2: the unclipped branch w * A = min(r, 2) * -1 = -2 is the min
    # (clip gives -1.28), so loss = 2 and d loss / d logprob = -(2 * -1) = 2 for every r: the
    # gradient is capped, not zeroed, and no overflow leaks in.
    batch = _batch([[ratio]], [-1.0])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=1)

    assert loss.item() == pytest.approx(2.0)
    assert _grad(batch, loss).item() == pytest.approx(2.0)
    assert metrics["importance_weight_mean"] == pytest.approx(2.0)
    assert metrics["truncated_fraction"] == 1.0
    assert metrics["ratio_max"] == pytest.approx(ratio)


def test_truncation_never_overrides_the_clip_for_positive_advantages() -> None:
    # A = +1, r = 5: w * A = 2 but clip gives 1.28, the smaller: clipped, no gradient.
    batch = _batch([[5.0]], [1.0])
    loss, metrics = policy_loss(batch, CONFIG, total_tokens=1)

    assert loss.item() == pytest.approx(-1.28)
    assert _grad(batch, loss).item() == 0.0
    assert metrics["clip_fraction"] == 1.0


def test_config_rejects_a_cap_inside_the_clip_band() -> None:
    with pytest.raises(ValueError, match="max_importance_weight"):
        LossConfig(max_importance_weight=1.1)


# -- normalisation ---------------------------------------------------------------------------


def test_micro_batches_sum_to_the_full_batch() -> None:
    generator = torch.Generator().manual_seed(0)
    behaviour = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 3
    noise = torch.randn(4, 6, generator=generator, dtype=torch.float64) * 0.4
    logprobs = (behaviour + noise).requires_grad_()
    mask = torch.rand(4, 6, generator=generator) > 0.3
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    total = int(mask.sum())

    def part(rows: slice) -> torch.Tensor:
        batch = LossBatch(logprobs[rows], behaviour[rows], advantages[rows], mask[rows])
        return policy_loss(batch, CONFIG, total_tokens=total)[0]

    full = part(slice(0, 4))
    halves = part(slice(0, 2)) + part(slice(2, 4))

    assert halves.item() == pytest.approx(full.item())
    (full_grad,) = torch.autograd.grad(full, logprobs)
    (halves_grad,) = torch.autograd.grad(halves, logprobs)
    assert torch.allclose(halves_grad, full_grad)


def test_rejects_a_non_positive_token_count_and_float_masks() -> None:
    batch = _batch([[1.0]], [1.0])
    with pytest.raises(ValueError, match="total_tokens"):
        policy_loss(batch, CONFIG, total_tokens=0)
    float_mask = LossBatch(
        batch.logprobs, batch.behaviour_logprobs, batch.advantages, batch.loss_mask.double()
    )
    with pytest.raises(ValueError, match="bool"):
        policy_loss(float_mask, CONFIG, total_tokens=1)


# -- KL to a reference -----------------------------------------------------------------------


def test_kl_term_is_zero_when_reference_equals_current() -> None:
    config = LossConfig(kl_coef=0.5)
    batch = _batch([[1.1, 0.9, 1.3]], [1.0], ref_log_ratios=[[0.0, 0.0, 0.0]])
    plain = _batch([[1.1, 0.9, 1.3]], [1.0])
    loss, metrics = policy_loss(batch, config, total_tokens=3)
    plain_loss, _ = policy_loss(plain, config, total_tokens=3)

    assert metrics["kl"] == 0.0
    assert loss.item() == pytest.approx(plain_loss.item())
    assert torch.allclose(_grad(batch, loss), _grad(plain, plain_loss))


def test_kl_term_hand_computed() -> None:
    # A = 0 removes the policy term. ref - current = log 2 on the one trained token:
    #   k3 = e^(log 2) - 1 - log 2 = 1 - log 2 ≈ 0.3069; loss = 0.5 * k3 / N with N = 2
    #   d k3 / d logprob = 1 - e^(ref - logprob) = 1 - 2 = -1 -> grad = 0.5 * -1 / 2 = -0.25
    # (the KL pulls the current logprob up toward the reference's).
    config = LossConfig(kl_coef=0.5)
    batch = _batch([[1.0, 1.0]], [0.0], [[True, False]], ref_log_ratios=[[math.log(2), 9.0]])
    loss, metrics = policy_loss(batch, config, total_tokens=2)

    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2)) / 2)
    assert metrics["kl"] == pytest.approx(1 - math.log(2))
    assert _grad(batch, loss)[0].tolist() == pytest.approx([-0.25, 0.0])


# -- sequence_mismatch -----------------------------------------------------------------------


def test_sequence_mismatch_is_mean_k3_per_sequence() -> None:
    # seq 0: r = 1, 1 -> k3 0. seq 1: r = 2 on its one trained token -> 1 - log 2.
    # seq 2: nothing trained -> 0 (not nan).
    behaviour = torch.full((3, 2), -2.0, dtype=torch.float64)
    log_ratio = torch.tensor([[0.0, 0.0], [math.log(2), 40.0], [3.0, -3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False], [False, False]])

    mismatch = sequence_mismatch(behaviour + log_ratio, behaviour, mask)

    assert mismatch.tolist() == pytest.approx([0.0, 1 - math.log(2), 0.0])
    assert not mismatch.requires_grad


# -- the clip against the proximal policy (decoupled PPO, the default) ----------------------


def test_default_clips_against_the_proximal_policy() -> None:
    assert LossConfig().clip_against == "proximal"
    with pytest.raises(ValueError, match="clip_against"):
        LossConfig(clip_against="reference")


@pytest.mark.parametrize("advantage", [1.0, -2.0])
def test_on_policy_tokens_get_the_same_loss_either_way(advantage: float) -> None:
    # r = 1 (fresh, no mismatch): proximal = behaviour, nothing is clipped or truncated.
    batch = _batch([[1.0, 1.0]], [advantage])
    loss, metrics = policy_loss(batch, PROXIMAL, total_tokens=2)
    behaviour_loss, _ = policy_loss(batch, CONFIG, total_tokens=2)

    assert loss.item() == pytest.approx(behaviour_loss.item())
    assert loss.item() == pytest.approx(-advantage)
    assert _grad(batch, loss)[0].tolist() == pytest.approx([-advantage / 2, -advantage / 2])
    assert metrics["clip_fraction"] == 0.0 and metrics["behaviour_clip_fraction"] == 0.0


def test_proximal_hand_computed() -> None:
    # Stale tokens (their policy moved since vLLM sampled them), N = 4:
    #   A = +1, r = 1.5: past 1.28 in A's direction. Against the behaviour policy: clipped, no
    #     gradient. Proximal: w = 1.5, objective w * A = 1.5, gradient -1.5 / N.
    #   A = +1, r = 3: w = min(3, 2) = 2: objective 2, gradient -2 / N.
    #   A = -1, r = 0.5: below 0.8 in A's direction (behaviour: clipped). Proximal: w = 0.5,
    #     objective -0.5, gradient +0.5 / N.
    #   A = -1, r = 3: w = 2, objective -2, gradient 2 / N (truncated either way).
    #   loss = -(1.5 + 2 - 0.5 - 2) / 4 = -0.25
    batch = _batch([[1.5, 3.0], [0.5, 3.0]], [1.0, -1.0])
    loss, metrics = policy_loss(batch, PROXIMAL, total_tokens=4)

    assert loss.item() == pytest.approx(-0.25)
    assert _grad(batch, loss).flatten().tolist() == pytest.approx([-0.375, -0.5, 0.125, 0.5])
    # one step per batch: the proximal ratio is 1, so its clip never binds
    assert metrics["clip_fraction"] == 0.0
    # what the clip against the behaviour policy would have zeroed: r = 1.5 and 3 with A > 0,
    # r = 0.5 with A < 0
    assert metrics["behaviour_clip_fraction"] == pytest.approx(3 / 4)
    assert metrics["truncated_fraction"] == pytest.approx(2 / 4)
    assert metrics["importance_weight_mean"] == pytest.approx((1.5 + 2 + 0.5 + 2) / 4)
    behaviour_grad = _grad(batch, policy_loss(batch, CONFIG, total_tokens=4)[0])
    assert behaviour_grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5])


def test_proximal_masked_garbage_neither_counts_nor_leaks() -> None:
    behaviour = torch.tensor([[-1.0, float("-inf"), -2.0]], dtype=torch.float64)
    logprobs = torch.tensor([[-1.0, float("nan"), -2.0]], dtype=torch.float64)
    batch = LossBatch(
        logprobs=logprobs.requires_grad_(),
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([1.0], dtype=torch.float64),
        loss_mask=torch.tensor([[True, False, True]]),
    )
    loss, _ = policy_loss(batch, PROXIMAL, total_tokens=2)

    assert loss.item() == pytest.approx(-1.0)
    grad = _grad(batch, loss)
    assert torch.isfinite(grad).all()
    assert grad[0].tolist() == pytest.approx([-0.5, 0.0, -0.5])


def test_proximal_micro_batches_sum_to_the_full_batch() -> None:
    generator = torch.Generator().manual_seed(1)
    behaviour = -torch.rand(4, 6, generator=generator, dtype=torch.float64) * 3
    logprobs = behaviour + torch.randn(4, 6, generator=generator, dtype=torch.float64)
    logprobs.requires_grad_()
    mask = torch.rand(4, 6, generator=generator) > 0.3
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    total = int(mask.sum())

    def part(rows: slice) -> torch.Tensor:
        batch = LossBatch(logprobs[rows], behaviour[rows], advantages[rows], mask[rows])
        return policy_loss(batch, PROXIMAL, total_tokens=total)[0]

    full, halves = part(slice(0, 4)), part(slice(0, 2)) + part(slice(2, 4))
    assert halves.item() == pytest.approx(full.item())
    (full_grad,) = torch.autograd.grad(full, logprobs)
    (halves_grad,) = torch.autograd.grad(halves, logprobs)
    assert torch.allclose(halves_grad, full_grad)
