"""The policy update: logprobs exactly as vLLM computes them, then one GRPO optimizer step.

Invariant: the trainer scores each sampled token under the same processing vLLM applied
before it reported the logprob (`--logprobs-mode processed_logprobs`): logits divided by
the call's temperature, then its top-k and top-p filters, then log-softmax. Memory stays
bounded: samples go through in micro-batches of at most `micro_batch_tokens` tokens, with
gradients accumulated and the loss normalised by the global count of trained tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from learner.loss import LossBatch, LossConfig, policy_loss, sequence_mismatch
from learner.samples import Sample, Sampling


@dataclass(frozen=True)
class TrainerConfig:
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 8192
    # sequences whose recorded-vs-recomputed mismatch (mean |delta logprob|) exceeds this
    # are not trained on: their tokens were not produced by the weights we think they were
    max_sequence_mismatch: float = 1.0
    mask_truncated: bool = True
    loss: LossConfig = field(default_factory=LossConfig)


def processed_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, sampling: Sampling
) -> torch.Tensor:
    """Log-probability of `targets` after temperature, top-k and top-p, like vLLM's sampler.

    logits: [B, T, V] float32; targets: [B, T] token ids. Returns [B, T].
    """
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    scaled = logits / temperature
    if 0 < sampling.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, sampling.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the mass before it already reaches top_p (keep at least one)
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    logprobs = torch.log_softmax(scaled, dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class MicroBatch:
    samples: list[Sample]
    advantages: list[float]


def micro_batches(
    samples: list[Sample], advantages: list[float], budget: int
) -> Iterator[MicroBatch]:
    """Consecutive groups of samples whose padded size stays within `budget` tokens, and
    which share sampling parameters (one processing per forward pass)."""

    def key(i: int) -> tuple[float, float, int, int]:
        sampling = samples[i].sampling
        return (sampling.temperature, sampling.top_p, sampling.top_k, i)

    order = sorted(range(len(samples)), key=key)
    batch: list[int] = []
    for index in order:
        candidate = [*batch, index]
        longest = max(len(samples[i].token_ids) for i in candidate)
        same_sampling = not batch or samples[batch[0]].sampling == samples[index].sampling
        if batch and (longest * len(candidate) > budget or not same_sampling):
            yield MicroBatch([samples[i] for i in batch], [advantages[i] for i in batch])
            batch = [index]
        else:
            batch = candidate
    if batch:
        yield MicroBatch([samples[i] for i in batch], [advantages[i] for i in batch])


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig,
        device: str | None = None,
        reference: torch.nn.Module | None = None,
    ) -> None:
        """`reference`: a frozen policy for the KL term (needed when loss.kl_coef > 0),
        except for a LoRA model, whose reference is its base: the adapter switched off."""
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = model.to(self.device)
        self.config = config
        if config.loss.kl_coef > 0 and reference is None and not _has_adapter(model):
            raise ValueError("kl_coef > 0 needs a reference model")
        self.reference = None if reference is None else reference.to(self.device).eval()
        if self.reference is not None:
            self.reference.requires_grad_(False)
        # a LoRA model trains its adapter only: the base weights stay frozen
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=config.learning_rate,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )

    def set_learning_rate(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = value

    def trainable(self, samples: list[Sample]) -> list[Sample]:
        return [
            s
            for s in samples
            if s.trained_tokens > 0 and not (self.config.mask_truncated and s.truncated)
        ]

    def _tensors(self, batch: MicroBatch) -> dict[str, torch.Tensor]:
        width = max(len(s.token_ids) for s in batch.samples)
        ids = torch.zeros((len(batch.samples), width), dtype=torch.long)
        mask = torch.zeros((len(batch.samples), width), dtype=torch.bool)
        behaviour = torch.zeros((len(batch.samples), width), dtype=torch.float32)
        attention = torch.zeros((len(batch.samples), width), dtype=torch.long)
        for row, sample in enumerate(batch.samples):
            n = len(sample.token_ids)
            ids[row, :n] = torch.tensor(sample.token_ids)
            mask[row, :n] = torch.tensor(sample.loss_mask)
            behaviour[row, :n] = torch.tensor(sample.logprobs)
            attention[row, :n] = 1
        # position t predicts token t+1: shift targets, mask and behaviour logprobs
        return {
            "ids": ids.to(self.device),
            "attention": attention.to(self.device),
            "targets": ids[:, 1:].to(self.device),
            "mask": mask[:, 1:].to(self.device),
            "behaviour": behaviour[:, 1:].to(self.device),
            "advantages": torch.tensor(batch.advantages, dtype=torch.float32).to(self.device),
        }

    def token_logprobs(self, batch: MicroBatch, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.model(input_ids=tensors["ids"], attention_mask=tensors["attention"]).logits
        return processed_logprobs(
            logits[:, :-1].float(), tensors["targets"], batch.samples[0].sampling
        )

    def step(self, samples: list[Sample], advantages: list[float]) -> dict[str, Any]:
        """One optimizer step over all samples (gradient accumulation across micro-batches).

        The loss is normalised by the trained tokens that remain after sequences with too
        large a recorded-vs-recomputed mismatch are dropped; metrics are token-weighted
        means over micro-batches, except minima and maxima.
        """
        started = time.monotonic()
        # no dropout: the ratio compares against vLLM, which samples without it
        self.model.eval()
        # position 0 predicts nothing: only tokens after it can carry loss
        total_tokens = sum(sum(s.loss_mask[1:]) for s in samples)
        if total_tokens == 0:
            return {"tokens": 0, "skipped": "no trainable tokens"}
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}
        kept = dropped = 0
        loss_sum = 0.0
        for batch in micro_batches(samples, advantages, self.config.micro_batch_tokens):
            tensors = self._tensors(batch)
            logprobs = self.token_logprobs(batch, tensors)
            mismatch = sequence_mismatch(logprobs.detach(), tensors["behaviour"], tensors["mask"])
            off = mismatch > self.config.max_sequence_mismatch
            dropped += int(off.sum())
            mask = tensors["mask"] & ~off.unsqueeze(-1)
            loss, metrics = policy_loss(
                LossBatch(
                    logprobs=logprobs,
                    behaviour_logprobs=tensors["behaviour"],
                    advantages=tensors["advantages"],
                    loss_mask=mask,
                    ref_logprobs=self._reference_logprobs(batch, tensors),
                ),
                self.config.loss,
                total_tokens=total_tokens,
            )
            tokens = int(metrics.get("tokens", 0))
            if tokens == 0:
                continue
            loss.backward()
            kept += tokens
            loss_sum += float(loss.detach())
            _accumulate(sums, extremes, metrics, tokens)
        if kept == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return {"tokens": 0, "dropped_mismatch": dropped, "skipped": "all sequences dropped"}
        if kept < total_tokens:
            # renormalise: dropped sequences must not shrink the step of the others
            for parameter in self.parameters:
                if parameter.grad is not None:
                    parameter.grad.mul_(total_tokens / kept)
            loss_sum *= total_tokens / kept
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **{key: value / kept for key, value in sums.items()},
            **extremes,
            "loss": loss_sum,
            "samples": len(samples),
            "trained_tokens": kept,
            "dropped_mismatch": dropped,
            "grad_norm": float(grad_norm),
            "step_seconds": time.monotonic() - started,
        }

    @torch.no_grad()
    def _reference_logprobs(
        self, batch: MicroBatch, tensors: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        if self.config.loss.kl_coef == 0:
            return None
        inputs = {"input_ids": tensors["ids"], "attention_mask": tensors["attention"]}
        if self.reference is not None:
            logits = self.reference(**inputs).logits
        else:
            with self.model.disable_adapter():  # type: ignore[operator]
                logits = self.model(**inputs).logits
        return processed_logprobs(
            logits[:, :-1].float(), tensors["targets"], batch.samples[0].sampling
        )

    @torch.no_grad()
    def logprobs_of(self, prompt: list[int], completion: list[int]) -> list[float]:
        """Logprobs of `completion` after `prompt` at temperature 1 (the publisher's probe)."""
        self.model.eval()
        ids = torch.tensor([prompt + completion], device=self.device)
        logits = self.model(input_ids=ids).logits[:, :-1].float()
        all_logprobs = torch.log_softmax(logits, dim=-1)
        targets = ids[:, 1:]
        picked = all_logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[0]
        return picked[len(prompt) - 1 :].tolist()


def _has_adapter(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "disable_adapter", None))


def _accumulate(
    sums: dict[str, float], extremes: dict[str, float], metrics: dict[str, Any], tokens: int
) -> None:
    for key, value in metrics.items():
        if key == "tokens" or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        if key.endswith("_min"):
            extremes[key] = min(extremes.get(key, value), value)
        elif key.endswith("_max"):
            extremes[key] = max(extremes.get(key, value), value)
        else:
            sums[key] = sums.get(key, 0.0) + value * tokens
