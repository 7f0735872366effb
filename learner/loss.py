"""The GRPO policy loss: token-level clipped policy gradient on exactly the sampled tokens.

Invariant: the loss is a SUM over trained tokens divided by the global trained-token count, so
the losses of any split of a batch into micro-batches (or ranks) add up to the full-batch loss,
and a token outside ``loss_mask`` contributes neither value nor gradient.

Per trained token, with ``log r = logprobs - behaviour_logprobs`` (current policy vs the
logprob vLLM recorded when it sampled the token), the sequence's advantage ``A`` and the
truncated importance weight ``w = min(r, C)``, ``C = max_importance_weight``:

    clip against the proximal policy (``clip_against="proximal"``, the default: decoupled PPO)
        p         = pi / pi_prox, pi_prox = the policy this optimizer step starts from
        objective = sg(w) * min(p * A, clip(p, 1 - clip_low, 1 + clip_high) * A)
    clip against the behaviour policy (``clip_against="behaviour"``: PPO as written)
        objective = min(w * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
    loss = -(sum(objective) - kl_coef * sum(k3(ref, logprobs))) / total_tokens

The learner takes one optimizer step per batch, so when the loss is computed the current
policy is the proximal one: ``p`` is exactly 1, its clip never binds, and the proximal loss is
truncated importance-sampled policy gradient, each token's gradient ``w * A * grad(logprob)``.
For a fresh sample ``r`` is pure trainer/vLLM numerical mismatch (close to 1) and the two
losses are the same. A stale sample (served by an older version) carries the policy lag since
then in ``r``: clipped against the behaviour policy, every token whose probability already
moved past the band in the direction ``A`` pushes it gets no gradient at all, although none of
that move came from this batch. A batch formed from live traffic is at least a version old
(the learner trains while the version before serves), so that is no corner case. On the
letter toy of bench/learning_per_step.py (seeded, one step per batch of 64, lr 3e-3), the
reward gained in 25 steps fell from 0.324 on-policy to 0.234 at a lag of one version and
0.123-0.148 at two with the behaviour clip, and to 0.314 and 0.207-0.300 with the proximal
one; through the proxy on live traffic from 8 clients (trained samples 1.5 versions old on
average, 4% fresh), `onthejob learn` gained 0.250-0.271 with the behaviour clip and
0.338-0.349 with the proximal one, against 0.335 for the bare on-policy loop. Decoupled PPO
(Hilton et al., 2021, "Batch size-invariance for policy optimization";
AReaL's asynchronous RL does the same) bounds each update against the policy it starts from
and leaves the behaviour policy to the importance weight.

Truncation caps that weight at ``C``: for ``A < 0`` and a large ``r`` the token's gradient
weight would be unbounded. Capped in value AND as the coefficient of ``A * grad(logprob)``:
the gradient keeps flowing with weight ``C`` (truncated importance sampling), it is not zeroed
(as dual-clip PPO would). Because ``C >= 1 + clip_high`` the cap never binds for ``A > 0``
under the behaviour clip: the clip binds first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CLIP_AGAINST = ("proximal", "behaviour")


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2  # ratio lower bound 1 - clip_low
    clip_high: float = 0.28  # clip-higher (DAPO): upper bound 1 + clip_high
    max_importance_weight: float = 2.0  # cap C on the behaviour importance weight (see module)
    kl_coef: float = 0.0  # optional KL to a reference policy (k3 estimator)
    # what the clip bounds the ratio against: "proximal" (the weights this step starts from;
    # decoupled PPO) or "behaviour" (the weights vLLM sampled with); see the module docstring
    clip_against: str = "proximal"

    def __post_init__(self) -> None:
        if self.clip_against not in CLIP_AGAINST:
            raise ValueError(
                f"clip_against must be one of {CLIP_AGAINST}, got {self.clip_against!r}"
            )
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")
        # Below 1 + clip_high the cap would override clip-higher for positive advantages.
        if self.max_importance_weight < 1.0 + self.clip_high:
            raise ValueError(
                f"max_importance_weight must be >= 1 + clip_high = {1.0 + self.clip_high}, "
                f"got {self.max_importance_weight}"
            )
        if self.kl_coef < 0.0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


@dataclass(frozen=True)
class LossBatch:
    """One micro-batch. Values at positions outside ``loss_mask`` are ignored (may be garbage)."""

    logprobs: torch.Tensor  # [B, T] current policy logprob of each token (requires grad)
    behaviour_logprobs: torch.Tensor  # [B, T] logprobs vLLM recorded when it sampled the token
    # [B] per sequence, broadcast over its tokens, or [B, T] per token (per-turn credit)
    advantages: torch.Tensor
    loss_mask: torch.Tensor  # [B, T] bool: True only on sampled tokens that are trained
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference policy, for the KL term


def policy_loss(
    batch: LossBatch, config: LossConfig, *, total_tokens: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch, normalised by ``total_tokens``: the GLOBAL count of trained
    tokens across all micro-batches and ranks of the optimizer step."""
    _check_batch(batch)
    if total_tokens <= 0:
        raise ValueError(f"total_tokens must be > 0, got {total_tokens}")
    mask = batch.loss_mask
    log_ratio = _masked(batch.logprobs - batch.behaviour_logprobs, mask)
    advantages = batch.advantages.to(log_ratio.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_ratio)
    behaviour_clipped = _past_band(log_ratio, advantages, config)
    if config.clip_against == "behaviour":
        objective, clipped, weight = _clipped_objective(log_ratio, advantages, config)
    else:
        objective, clipped, weight = _decoupled_objective(
            batch.logprobs, mask, log_ratio, advantages, config
        )
    loss = -objective[mask].sum() / total_tokens
    metrics = _ratio_metrics(log_ratio, mask, clipped, weight, config)
    metrics["behaviour_clip_fraction"] = _masked_mean(behaviour_clipped.float(), mask)
    if batch.ref_logprobs is not None:
        kl = _k3(_masked(batch.ref_logprobs - batch.logprobs, mask))
        loss = loss + config.kl_coef * kl[mask].sum() / total_tokens
        metrics["kl"] = _masked_mean(kl.detach(), mask)
    return loss, metrics


def sequence_mismatch(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """[B] mean k3 estimate of KL(vLLM || trainer) over each sequence's trained tokens (0 for a
    sequence without any), on the same scale as the ``mismatch_kl`` metric, so the trainer can
    drop sequences whose recorded and recomputed logprobs disagree far more than the rest."""
    with torch.no_grad():
        k3 = _k3(_masked(logprobs - behaviour_logprobs, loss_mask))
        counts = loss_mask.sum(dim=-1).clamp_min(1)
        return (k3 * loss_mask).sum(dim=-1) / counts


def _check_batch(batch: LossBatch) -> None:
    shape = batch.logprobs.shape
    if batch.logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(shape)}")
    tensors = {"behaviour_logprobs": batch.behaviour_logprobs, "loss_mask": batch.loss_mask}
    if batch.ref_logprobs is not None:
        tensors["ref_logprobs"] = batch.ref_logprobs
    for name, tensor in tensors.items():
        if tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    if batch.advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages must be [B] = [{shape[0]}] or [B, T] = {list(shape)}, "
            f"got {tuple(batch.advantages.shape)}"
        )
    # A float mask would silently weight tokens instead of selecting them.
    if batch.loss_mask.dtype != torch.bool:
        raise ValueError(f"loss_mask must be bool, got {batch.loss_mask.dtype}")


def _masked(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # Zero outside the mask so that prompt positions (logprob 0, -inf or junk) can never turn
    # into inf/nan in the forward pass or leak a nan gradient through a multiply-by-zero.
    return torch.where(mask, log_ratio, torch.zeros_like(log_ratio))


def _clipped_objective(
    log_ratio: torch.Tensor, advantages: torch.Tensor, config: LossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token objective, where clipping zeroed the gradient, and the weight w = min(r, C)."""
    weight = _truncated_ratio(log_ratio, config.max_importance_weight)
    # Clipping in log space keeps the gradient exactly 0 outside the band even if r overflows.
    low, high = math.log1p(-config.clip_low), math.log1p(config.clip_high)
    clipped_ratio = log_ratio.clamp(low, high).exp()
    objective = torch.minimum(weight * advantages, clipped_ratio * advantages)
    return objective, _past_band(log_ratio, advantages, config), weight


def _decoupled_objective(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w * min(p * A, clip(p) * A) with the proximal ratio p = pi / pi_prox, where pi_prox is
    the policy this step starts from (the logprobs themselves, detached: one optimizer step
    per batch), and the behaviour weight w = min(pi_prox / pi_behaviour, C), a constant."""
    proximal = _masked(logprobs - logprobs.detach(), mask)  # value 0, gradient 1
    weight = log_ratio.detach().clamp_max(math.log(config.max_importance_weight)).exp()
    low, high = math.log1p(-config.clip_low), math.log1p(config.clip_high)
    ratio = proximal.exp()
    clipped_ratio = proximal.clamp(low, high).exp()
    objective = weight * torch.minimum(ratio * advantages, clipped_ratio * advantages)
    return objective, _past_band(proximal, advantages, config), weight


def _past_band(
    log_ratio: torch.Tensor, advantages: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """Where the clip takes the min: past the band in the direction A pushes."""
    low, high = math.log1p(-config.clip_low), math.log1p(config.clip_high)
    return ((advantages > 0) & (log_ratio > high)) | ((advantages < 0) & (log_ratio < low))


def _truncated_ratio(log_ratio: torch.Tensor, cap: float) -> torch.Tensor:
    """min(r, cap) in value, with d/dθ = min(r, cap) * d(log r)/dθ: the excess over the cap is
    subtracted as a constant, so a capped token still gets gradient, at weight ``cap``."""
    excess = (log_ratio - math.log(cap)).clamp_min(0.0).detach()
    return (log_ratio - excess).exp()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(p || q) from log(q / p) at a sample drawn from p: non-negative,
    unbiased, zero exactly when the two logprobs agree."""
    return log_ratio.exp() - 1.0 - log_ratio


def _ratio_metrics(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    clipped: torch.Tensor,
    weight: torch.Tensor,
    config: LossConfig,
) -> dict[str, float]:
    """Statistics over this micro-batch's trained tokens; ``tokens`` lets the caller weight
    them when averaging over micro-batches. Neutral values (ratio 1) when there are none."""
    tokens = int(mask.sum())
    log_ratio, weight = log_ratio.detach()[mask], weight.detach()[mask]
    if tokens == 0:
        return {
            "tokens": 0.0,
            "clip_fraction": 0.0,
            "truncated_fraction": 0.0,
            "ratio_mean": 1.0,
            "ratio_min": 1.0,
            "ratio_max": 1.0,
            "importance_weight_mean": 1.0,
            "importance_weight_std": 0.0,
            "mismatch_kl": 0.0,
        }
    ratio = log_ratio.exp()
    return {
        "tokens": float(tokens),
        "clip_fraction": clipped[mask].float().mean().item(),
        "truncated_fraction": (ratio > config.max_importance_weight).float().mean().item(),
        "ratio_mean": ratio.mean().item(),
        "ratio_min": ratio.min().item(),
        "ratio_max": ratio.max().item(),
        "importance_weight_mean": weight.mean().item(),
        "importance_weight_std": weight.std(correction=0).item(),
        "mismatch_kl": _k3(log_ratio).mean().item(),
    }


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return values[mask].mean().item() if bool(mask.any()) else 0.0
