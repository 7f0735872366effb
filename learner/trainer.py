"""The policy update: logprobs exactly as vLLM computes them, then one GRPO optimizer step.

Invariant: the trainer scores each sampled token under the same processing vLLM applied
before it reported the logprob (`--logprobs-mode processed_logprobs`), each sample under
its own call's sampling as the proxy recorded it: penalties on what the call had seen,
temperature, min-p, top-k and top-p, then log-softmax. Memory stays
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


@dataclass(frozen=True)
class TokenHistory:
    """What vLLM's penalties see before each of N positions: the tokens of the call's
    prompt and of its output so far (repetition penalty), and how often each token occurs
    in that output so far (frequency and presence penalties)."""

    seen: torch.Tensor  # [N, V] bool
    output_counts: torch.Tensor  # [N, V] float32


def token_history(
    ids: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor, vocab: int
) -> TokenHistory:
    """History at `positions` (ascending; position t predicts ids[t + 1]) of the sequence
    `ids`, where `starts[i]` is where the output of the call that sampled ids[positions[i]
    + 1] begins. The call's prompt and output so far are ids[:t + 1]; its output ids[start:
    t + 1]. Costs one [span, V] running count, span = last - first position + 1."""
    first, last = int(positions[0]), int(positions[-1])
    counts = torch.zeros((last - first + 1, vocab), dtype=torch.float32, device=ids.device)
    counts[0] = torch.bincount(ids[: first + 1], minlength=vocab)[:vocab].float()
    if last > first:
        steps = torch.nn.functional.one_hot(ids[first + 1 : last + 1], vocab).float()
        counts[1:] = steps
        counts = counts.cumsum(dim=0)
    at = counts[positions - first]  # occurrences in ids[:t + 1]
    before = torch.zeros_like(at)
    for start in torch.unique(starts).tolist():
        rows = starts == start
        before[rows] = torch.bincount(ids[:start], minlength=vocab)[:vocab].float()
    return TokenHistory(seen=at > 0, output_counts=at - before)


def processed_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    sampling: Sampling,
    history: TokenHistory | None = None,
) -> torch.Tensor:
    """Log-probability of `targets` after vLLM's processing (see `Sampling`), the way
    vLLM 0.32's sampler does it: penalties, temperature, min-p, then top-k and top-p
    (ascending sort, a token dropped while the mass up to it is at most 1 - top_p).

    logits: [..., V] float32; targets: [...]; history: the [N, V] token history of the
    flattened positions, needed when `sampling.penalised`. Returns [...].
    """
    shape, vocab = targets.shape, logits.shape[-1]
    z = logits.reshape(-1, vocab)
    if sampling.penalised:
        if history is None:
            raise ValueError("penalised sampling needs the token history")
        z = _penalise(z, history, sampling)
    if sampling.temperature != 1.0:
        z = z / sampling.temperature
    with torch.no_grad():
        drop = _filtered(z.detach(), sampling)
    if drop is not None:
        z = z.masked_fill(drop, float("-inf"))
    picked = torch.log_softmax(z, dim=-1).gather(-1, targets.reshape(-1, 1))
    return picked.reshape(shape)


def _penalise(z: torch.Tensor, history: TokenHistory, sampling: Sampling) -> torch.Tensor:
    if sampling.repetition_penalty != 1.0:
        penalty = torch.tensor(sampling.repetition_penalty, dtype=z.dtype, device=z.device)
        penalties = torch.where(history.seen, penalty, torch.ones_like(penalty))
        # vLLM: a positive logit is divided by the penalty, any other multiplied by it
        z = z * torch.where(z > 0, 1.0 / penalties, penalties)
    if sampling.frequency_penalty != 0.0:
        z = z - sampling.frequency_penalty * history.output_counts
    if sampling.presence_penalty != 0.0:
        z = z - sampling.presence_penalty * (history.output_counts > 0).to(z.dtype)
    return z


def _filtered(z: torch.Tensor, sampling: Sampling) -> torch.Tensor | None:
    """Where min-p, top-k and top-p drop a token (None: nowhere). z: [N, V] scaled."""
    vocab = z.shape[-1]
    drop: torch.Tensor | None = None
    if sampling.min_p > 0.0:
        probs = torch.softmax(z, dim=-1)
        drop = probs < probs.amax(dim=-1, keepdim=True) * sampling.min_p
        z = z.masked_fill(drop, float("-inf"))
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(z, dim=-1)  # ascending, like vLLM
        if top_k:
            kth = ordered[:, vocab - top_k : vocab - top_k + 1]
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        tail = cumulative <= 1 - sampling.top_p
        tail[:, -1] = False  # at least one token stays
        tail |= ordered == float("-inf")
        dropped = torch.zeros_like(tail).scatter(-1, order, tail)
    elif top_k:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        dropped = z < kth
    else:
        return drop
    return dropped if drop is None else drop | dropped


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
        return sample_logprobs(logits, batch, tensors)

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
        return sample_logprobs(logits, batch, tensors)

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


def sample_logprobs(
    logits: torch.Tensor, batch: MicroBatch, tensors: dict[str, torch.Tensor]
) -> torch.Tensor:
    """[B, T - 1] processed logprobs of each row's targets under its own sample's sampling,
    at the trained positions only (0 elsewhere: the loss never reads them)."""
    mask = tensors["mask"]
    rows, columns, values = [], [], []
    for row, sample in enumerate(batch.samples):
        positions = mask[row].nonzero().squeeze(-1)
        if positions.numel() == 0:
            continue
        history = None
        if sample.sampling.penalised:
            history = _history(sample, positions, tensors["ids"][row], logits.shape[-1])
        values.append(
            processed_logprobs(
                logits[row, positions].float(),
                tensors["targets"][row, positions],
                sample.sampling,
                history,
            )
        )
        rows.append(torch.full_like(positions, row))
        columns.append(positions)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
    if not values:
        return out
    return out.index_put((torch.cat(rows), torch.cat(columns)), torch.cat(values))


def _history(
    sample: Sample, positions: torch.Tensor, ids: torch.Tensor, vocab: int
) -> TokenHistory:
    start_of = [0] * len(sample.token_ids)
    for start, end in sample.completions:
        start_of[start:end] = [start] * (end - start)
    starts = torch.tensor(start_of, device=ids.device)[positions + 1]
    return token_history(ids[: len(sample.token_ids)], positions, starts, vocab)


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
