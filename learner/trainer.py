"""The policy update: logprobs exactly as vLLM computes them, then one GRPO optimizer step.

Invariant: the trainer scores each sampled token under the same processing vLLM applied
before it reported the logprob (`--logprobs-mode processed_logprobs`), each sample under
its own call's sampling as the proxy recorded it: penalties on what the call had seen,
temperature, min-p, top-k and top-p, then log-softmax. Memory stays
bounded: samples go through in micro-batches of at most `micro_batch_tokens` tokens (similar
lengths together), with gradients accumulated and the loss normalised by the global count of
trained tokens; within one, logprobs are computed `logprob_chunk_tokens` trained positions at
a time from the decoder's hidden states, so no [tokens, vocab] float32 tensor of a whole
micro-batch exists.

Precision (`TrainerConfig.precision`): "float32" computes in float32; "bfloat16" keeps the
trained float32 parameters (the master weights) and their AdamW state in `model`, and runs
the forward and backward passes on a bfloat16 copy of them (`compute`), whose gradients are
added up in float32 over the micro-batches; after each optimizer step the copy is refreshed
from the masters. vLLM serving bfloat16 loads exactly that copy (`checkpoint_dtype`), so
the trainer's recomputed logprobs are those of the weights vLLM holds. A LoRA model's frozen
base is held in bf16 alone (no master: it never changes), its adapter as float32 masters
with a bf16 copy, like full weights. "autocast" keeps one
float32 model and runs its matmuls under `torch.autocast(bfloat16)` (measured against the
other in bench/learner_step.py; see docs/learner/how-a-step-works.md).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch
from torch.distributed.checkpoint.state_dict import (
    OptimizerStateType,
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.optimizer import StateDict
from torch.utils.checkpoint import checkpoint

from learner.loss import LossBatch, LossConfig, policy_loss, sequence_mismatch
from learner.step_size import StepSize
from store.json_types import JsonObject
from store.samples import Sample, Sampling

PRECISIONS = ("float32", "bfloat16", "autocast")
TRAINING_STATE_FORMAT = 2  # optimizer state by parameter name, float32 masters beside it


class TrainingState(TypedDict, total=False):
    """What `Trainer.training_state` saves beside a checkpoint (torch.save)."""

    format: int  # TRAINING_STATE_FORMAT
    optimizer: OptimizerStateType  # by parameter name
    master: dict[str, torch.Tensor]  # the float32 masters, where checkpoints are bf16


@dataclass(frozen=True)
class TrainerConfig:
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 8192
    # trained positions whose processed logprobs are computed at once: the LM head's output
    # and its processing exist for this many positions at a time ([chunk, vocab] float32)
    logprob_chunk_tokens: int = 512
    # recompute each decoder layer's activations in the backward pass instead of keeping
    # them: less memory for about a third more compute
    activation_checkpointing: bool = False
    # sequences whose recorded-vs-recomputed mismatch (mean |delta logprob|) exceeds this
    # are not trained on: their tokens were not produced by the weights we think they were
    max_sequence_mismatch: float = 1.0
    # replies cut at max_tokens (learner/config.py's --truncated): "last" trains those that
    # are their trajectory's last reply, "train" all, "mask" none
    truncated: str = "last"
    # nats a token one step aims to move the policy (learner/step_size.py): the learning
    # rate is scaled down from `learning_rate` to it; 0: the learning rate as given
    step_kl: float = 0.0
    loss: LossConfig = field(default_factory=LossConfig)
    # "float32", "bfloat16" (bf16 compute, float32 master weights and AdamW state) or
    # "autocast" (float32 weights, bf16 matmuls); see the module docstring
    precision: str = "float32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


def truncated_trains(rule: str, sample: Sample) -> bool:
    """Whether a sample with a reply cut at max_tokens trains under `rule`: "train" always,
    "mask" never (overlong filtering), "last" where every cut reply is its trajectory's last:
    the reply the grade was given on, scored as the client got it. A cut reply before the
    last (a tool call cut mid-way, then a retry) did not earn the grade the later turns
    did, so it is left out."""
    if rule == "train":
        return True
    if rule == "mask":
        return False
    return not sample.cut_before_last


@dataclass(frozen=True)
class TokenHistory:
    """What vLLM's penalties see before each of N positions: the tokens of the call's
    prompt and of its output so far (repetition penalty), and how often each token occurs
    in that output so far (frequency and presence penalties). None: not needed."""

    seen: torch.Tensor | None  # [N, V] bool
    output_counts: torch.Tensor | None  # [N, V] float32


def token_history(
    ids: torch.Tensor,
    positions: torch.Tensor,
    starts: torch.Tensor,
    vocab: int,
    *,
    seen: bool = True,
    counts: bool = True,
) -> TokenHistory:
    """History at `positions` (ascending; position t predicts ids[t + 1]) of the sequence
    `ids`, where `starts[i]` is where the output of the call that sampled ids[positions[i]
    + 1] begins. The call's prompt and output so far are ids[:t + 1]; its output ids[start:
    t + 1]. Built by scattering the [N, span] (position, earlier token) pairs, never a
    [span, V] running count (span: from the first position, or start, to the last)."""
    device, n, last = ids.device, positions.numel(), int(positions[-1])
    rows = torch.arange(n, device=device)
    seen_tokens = None
    if seen:
        first = int(positions[0])
        seen_tokens = torch.zeros((n, vocab), dtype=torch.bool, device=device)
        seen_tokens[:, ids[: first + 1]] = True  # every position saw those
        later = torch.arange(first + 1, last + 1, device=device)
        row, column = (later[None, :] <= positions[:, None]).nonzero(as_tuple=True)
        seen_tokens[rows[row], ids[later[column]]] = True
    output_counts = None
    if counts:
        span = torch.arange(int(starts.min()), last + 1, device=device)
        inside = (span[None, :] >= starts[:, None]) & (span[None, :] <= positions[:, None])
        row, column = inside.nonzero(as_tuple=True)
        output_counts = torch.zeros((n, vocab), dtype=torch.float32, device=device)
        output_counts.index_put_(
            (rows[row], ids[span[column]]),
            torch.ones(row.numel(), dtype=torch.float32, device=device),
            accumulate=True,
        )
    return TokenHistory(seen=seen_tokens, output_counts=output_counts)


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
        assert history.seen is not None
        penalty = torch.tensor(sampling.repetition_penalty, dtype=z.dtype, device=z.device)
        penalties = torch.where(history.seen, penalty, torch.ones_like(penalty))
        # vLLM: a positive logit is divided by the penalty, any other multiplied by it
        z = z * torch.where(z > 0, 1.0 / penalties, penalties)
    counts = history.output_counts
    if sampling.frequency_penalty != 0.0:
        assert counts is not None
        z = z - sampling.frequency_penalty * counts
    if sampling.presence_penalty != 0.0:
        assert counts is not None
        z = z - sampling.presence_penalty * (counts > 0).to(z.dtype)
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
    if top_k:
        dropped = _top_k_top_p(z, top_k, sampling.top_p)
    elif sampling.top_p < 1.0:
        dropped = _top_p(z, sampling.top_p)
    else:
        return drop
    return dropped if drop is None else drop | dropped


def _top_p(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's top-p: ascending sort, a token dropped while the mass up to it is at most
    1 - top_p (the largest always stays)."""
    ordered, order = torch.sort(z, dim=-1)
    tail = torch.softmax(ordered, dim=-1).cumsum(dim=-1) <= 1 - top_p
    tail[:, -1] = False
    tail |= ordered == float("-inf")
    return torch.zeros_like(tail).scatter(-1, order, tail)


def _top_k_top_p(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k, then top-p among the k kept: the same tokens as vLLM's sort of the whole
    vocabulary (the dropped ones have probability 0 there) for a sort of k values. Where
    the k-th value is tied, more than k tokens stay, as in vLLM: the whole sort then."""
    values, indices = torch.topk(z, top_k, dim=-1)  # descending
    dropped = z < values[:, -1:]
    if top_p >= 1.0:
        return dropped
    if bool(((~dropped).sum(dim=-1) > top_k).any()):
        return dropped | _top_p(z.masked_fill(dropped, float("-inf")), top_p)
    ascending = values.flip(-1)
    tail = torch.softmax(ascending, dim=-1).cumsum(dim=-1) <= 1 - top_p
    tail[:, -1] = False
    return dropped.scatter(-1, indices.flip(-1), tail)


@dataclass
class MicroBatch:
    samples: list[Sample]
    advantages: list[float]


def micro_batches(
    samples: list[Sample], advantages: list[float], budget: int
) -> Iterator[MicroBatch]:
    """Groups of samples of similar length whose padded size stays within `budget` tokens:
    longest first, so each group pads to its first sample and little padding is computed.
    Samples of any sampling share a group: each is processed under its own."""
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].token_ids))
    batch: list[int] = []
    for index in order:
        # sorted longest first: the group's padded width is its first sample's length
        if batch and len(samples[batch[0]].token_ids) * (len(batch) + 1) > budget:
            yield MicroBatch([samples[i] for i in batch], [advantages[i] for i in batch])
            batch = []
        batch.append(index)
    if batch:
        yield MicroBatch([samples[i] for i in batch], [advantages[i] for i in batch])


def trainer_device(device: str | None) -> str:
    """The device a trainer asked for `device` runs on: the GPU when there is one."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig,
        device: str | None = None,
        reference: torch.nn.Module | None = None,
    ) -> None:
        """`model`: the policy to train, in the dtype it comes in (under "bfloat16"
        precision, its trained parameters made float32, the master weights, and its frozen
        ones, a LoRA adapter's base, bfloat16). `reference`: a frozen policy for the KL term
        (needed when loss.kl_coef > 0), except for a LoRA model, whose reference is its
        base: the adapter switched off."""
        self.device = trainer_device(device)
        self.config = config
        self.model = model.to(self.device)
        if config.precision == "bfloat16":
            masters_and_frozen(self.model)
        # what the forward and backward passes run on: a bfloat16 copy of the masters, or
        # the model itself
        self.compute = bfloat16_copy(self.model) if config.precision == "bfloat16" else self.model
        if config.activation_checkpointing:
            checkpoint_layers(self.compute)
        if config.loss.kl_coef > 0 and reference is None and not _has_adapter(model):
            raise ValueError("kl_coef > 0 needs a reference model")
        self.reference = None
        if reference is not None:
            reference = reference.to(self.device)
            if config.precision == "bfloat16":
                reference = bfloat16_copy(reference)  # its buffers (rotary) stay float32
            self.reference = reference.eval()
            self.reference.requires_grad_(False)
        # a LoRA model trains its adapter only: the base weights stay frozen
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        # (master, copy) of each trained parameter when they differ
        self._copies = [
            (p, c)
            for p, c in zip(self.model.parameters(), self.compute.parameters(), strict=True)
            if p.requires_grad and c is not p
        ]
        self._start_optimizer(config)

    def _start_optimizer(self, config: TrainerConfig) -> None:
        """AdamW over the trained parameters, and the scale of its rate (--step-kl)."""
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=config.learning_rate,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.learning_rate = config.learning_rate  # the most a GRPO step takes
        self.step_size = StepSize(config.step_kl)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the weights the forward pass runs on."""
        return torch.bfloat16 if self.config.precision == "bfloat16" else torch.float32

    @property
    def checkpoint_dtype(self) -> torch.dtype:
        """The dtype checkpoints for vLLM are written in: what the trainer computes with."""
        return torch.float32 if self.config.precision == "float32" else torch.bfloat16

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the forward pass runs in: bfloat16 autocast, or nothing."""
        if self.config.precision != "autocast":
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=torch.bfloat16)

    @torch.no_grad()
    def load_master(self, tensors: dict[str, torch.Tensor]) -> None:
        """Set the float32 trained parameters (e.g. saved beside a bf16 checkpoint, whose
        rounded weights lost what the next steps need) and refresh the compute copy."""
        named = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        missing = sorted(set(named) - set(tensors))
        if missing:
            raise ValueError(f"master weights lack {missing[:5]}")
        for name, parameter in named.items():
            parameter.copy_(tensors[name])
        self._refresh_compute()

    def master_state(self) -> dict[str, torch.Tensor]:
        """The float32 trained parameters by name, on the CPU."""
        return {
            name: p.detach().to("cpu").clone()
            for name, p in self.model.named_parameters()
            if p.requires_grad
        }

    def training_state(self) -> TrainingState:
        """What a resumed trainer needs besides its checkpoint: AdamW's state by parameter
        name (so any number of ranks can load it) and, when checkpoints are rounded to
        bf16, the float32 master weights (the rounding drops what small steps add up)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: TrainingState = {
            "format": TRAINING_STATE_FORMAT,
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=options),
        }
        if self.checkpoint_dtype != torch.float32:
            state["master"] = self.master_state()
        return state

    def load_training_state(self, state: TrainingState | StateDict) -> None:
        """Load what `training_state` saved (or a bare `optimizer.state_dict()`, as saved
        before names were used). Raises ValueError when it was saved for other parameters."""
        if state.get("format") != TRAINING_STATE_FORMAT:
            self.optimizer.load_state_dict(state)
            return
        try:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        except (KeyError, RuntimeError) as exc:
            raise ValueError(f"optimizer state for other parameters: {exc}") from exc
        if "master" in state:
            self.load_master(state["master"])

    @property
    def served_model(self) -> torch.nn.Module:
        """The module whose weights vLLM is to serve (a LoRA adapter is saved from it):
        under "bfloat16" exactly the copy the trainer computes with."""
        return self.compute if self.compute_dtype == self.checkpoint_dtype else self.model

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The weights vLLM is to serve, by state-dict name, in `checkpoint_dtype`."""
        return {
            name: _cast(tensor, self.checkpoint_dtype)
            for name, tensor in self.served_model.state_dict().items()
        }

    def set_learning_rate(self, value: float) -> None:
        self.learning_rate = value
        self._use_learning_rate(value)

    def _use_learning_rate(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = value

    def untrainable(self, sample: Sample) -> str | None:
        """Why the trainer leaves a sample out (a reason of learner/accounting.py), or None."""
        if sample.trained_tokens == 0:
            # per-turn credit masked every reply of it: none was judged
            return "not_credited" if sample.token_advantages is not None else "no_tokens"
        if sample.truncated and not truncated_trains(self.config.truncated, sample):
            return "truncated"
        return None

    def trainable(self, samples: list[Sample]) -> list[Sample]:
        return [s for s in samples if self.untrainable(s) is None]

    def _tensors(self, batch: MicroBatch) -> dict[str, torch.Tensor]:
        width = max(len(s.token_ids) for s in batch.samples)
        ids = torch.zeros((len(batch.samples), width), dtype=torch.long)
        mask = torch.zeros((len(batch.samples), width), dtype=torch.bool)
        behaviour = torch.zeros((len(batch.samples), width), dtype=torch.float32)
        attention = torch.zeros((len(batch.samples), width), dtype=torch.long)
        advantages = torch.zeros((len(batch.samples), width), dtype=torch.float32)
        rows = zip(batch.samples, batch.advantages, strict=True)
        for row, (sample, advantage) in enumerate(rows):
            n = len(sample.token_ids)
            ids[row, :n] = torch.tensor(sample.token_ids)
            mask[row, :n] = torch.tensor(sample.loss_mask)
            behaviour[row, :n] = torch.tensor(sample.logprobs)
            attention[row, :n] = 1
            # per-turn credit gives each token its turn's advantage, else one for the sample
            if sample.token_advantages is None:
                advantages[row, :n] = advantage
            else:
                advantages[row, :n] = torch.tensor(sample.token_advantages)
        # position t predicts token t+1: shift targets, mask and behaviour logprobs
        return {
            "ids": ids.to(self.device),
            "attention": attention.to(self.device),
            "targets": ids[:, 1:].to(self.device),
            "mask": mask[:, 1:].to(self.device),
            "behaviour": behaviour[:, 1:].to(self.device),
            "advantages": advantages[:, 1:].to(self.device),
        }

    def token_logprobs(
        self,
        batch: MicroBatch,
        tensors: dict[str, torch.Tensor],
        model: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """[B, T - 1] processed logprobs at the trained positions (see `sample_logprobs`),
        under the policy, or under `model`."""
        if model is not None:
            return self._scored(model, batch, tensors)
        return self._run(lambda policy: self._scored(policy, batch, tensors))

    def _run(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        """`work(policy)`: whatever a forward pass does with the model (a sharded trainer
        runs it inside its FSDP root's forward, so its parameters are gathered)."""
        return work(self.compute)

    def _run_reference(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        return work(self.reference)

    def _scored(
        self, model: torch.nn.Module, batch: MicroBatch, tensors: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        inputs = {
            "input_ids": tensors["ids"],
            "attention_mask": tensors["attention"],
            "use_cache": False,
        }
        with self.autocast():
            split = output_head(model)
            if split is None:  # logits are more than head(hidden): take them whole
                logits = model(**inputs).logits
                return sample_logprobs(logits, _identity, batch, tensors, self.config)
            decoder, head = split
            hidden = decoder(**inputs).last_hidden_state
            return sample_logprobs(hidden, head, batch, tensors, self.config)

    def _micro_batches(
        self, samples: list[Sample], advantages: list[float]
    ) -> Iterator[tuple[MicroBatch, bool]]:
        """The micro-batches this trainer computes, each with whether its loss counts."""
        for batch in micro_batches(samples, advantages, self.config.micro_batch_tokens):
            yield batch, True

    def _reduce(self, totals: dict[str, float], extremes: dict[str, float]) -> None:
        """Combine the step's counts and metric sums over every trainer of the step (one
        here): `totals` are summed, `extremes` taken by their min or max."""

    def step(
        self,
        samples: list[Sample],
        advantages: list[float],
        *,
        fresh_version: str | None = None,
        previous_versions: Mapping[str, float] | None = None,
        previous_scale: float | None = None,
    ) -> JsonObject:
        """One optimizer step over all samples (gradient accumulation across micro-batches).

        The loss is normalised by the trained tokens that remain after sequences with too
        large a recorded-vs-recomputed mismatch are dropped; metrics are token-weighted
        means over micro-batches, except minima and maxima. With `fresh_version` (the
        version the trainer's weights are), the samples all of whose calls it served get
        their own figures (`fresh_*`): their ratio is trainer-vs-vLLM numerics alone, with
        no policy lag in it. With `previous_versions` (the versions the last steps trained
        from, each with the last step's share of the KL since it: 1 for the version that
        step started from; learner/step_size.py measured_from) and `previous_scale` (the
        scale of the rate the last step took), the samples those versions produced measure
        how far the last step moved the policy, and the rate of this one follows.
        """
        started = time.monotonic()
        # no dropout: the ratio compares against vLLM, which samples without it
        self.compute.eval()
        # position 0 predicts nothing: only tokens after it can carry loss
        total_tokens = sum(sum(s.loss_mask[1:]) for s in samples)
        if total_tokens == 0:
            return {"tokens": 0, "skipped": "no trainable tokens"}
        sums: dict[str, float] = {}
        extremes: dict[str, float] = {}
        totals = {"kept": 0.0, "dropped": 0.0, "loss": 0.0}
        for batch, counts in self._micro_batches(samples, advantages):
            tensors = self._tensors(batch)
            logprobs = self.token_logprobs(batch, tensors)
            mismatch = sequence_mismatch(logprobs.detach(), tensors["behaviour"], tensors["mask"])
            off = mismatch > self.config.max_sequence_mismatch
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
            if not counts:
                # a pass that only keeps the other ranks' collectives company
                loss = loss * 0.0
            if loss.requires_grad:
                # even with every sequence dropped: sharded ranks run the same passes
                loss.backward()
                self._fold_grads()
            if counts and fresh_version is not None:
                _fresh_figures(totals, extremes, batch, logprobs, tensors, mask, fresh_version)
            if counts and previous_versions:
                _movement(totals, batch, logprobs, tensors, previous_versions)
            if counts:  # also where the whole micro-batch was dropped
                totals["dropped"] += int(off.sum())
            if counts and tokens:
                totals["kept"] += tokens
                totals["loss"] += float(loss.detach())
                _accumulate(sums, extremes, metrics, tokens)
        totals.update({f"sum:{key}": value for key, value in sums.items()})
        self._reduce(totals, extremes)
        kept, dropped = int(totals["kept"]), int(totals["dropped"])
        # totals are every rank's by now: each rank scales alike; measured also when every
        # sequence was dropped (the ones the last step moved most)
        self.step_size.follow(
            previous_scale,
            totals.get("movement_k3", 0.0),
            int(totals.get("movement_tokens", 0)),
        )
        if kept == 0:
            self.optimizer.zero_grad(set_to_none=True)
            return {"tokens": 0, "dropped_mismatch": dropped, "skipped": "all sequences dropped"}
        loss_sum = totals["loss"]
        if kept < total_tokens:
            # renormalise: dropped sequences must not shrink the step of the others
            for parameter in self.parameters:
                if parameter.grad is not None:
                    parameter.grad.mul_(total_tokens / kept)
            loss_sum *= total_tokens / kept
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        used_learning_rate = self.step_size.learning_rate(self.learning_rate)
        self._use_learning_rate(used_learning_rate)
        try:
            self.optimizer.step()
        finally:
            self._use_learning_rate(self.learning_rate)
        self.optimizer.zero_grad(set_to_none=True)
        self._refresh_compute()
        means = {
            key.removeprefix("sum:"): value / kept
            for key, value in totals.items()
            if key.startswith("sum:")
        }
        fresh: dict[str, float] = {}
        if totals.get("fresh_tokens"):
            fresh = {
                "fresh_tokens": int(totals["fresh_tokens"]),
                "fresh_mismatch_kl": totals["fresh_k3"] / totals["fresh_tokens"],
                "fresh_ratio_mean": totals["fresh_ratio"] / totals["fresh_tokens"],
            }
        moved: dict[str, float] = {
            "learning_rate_used": used_learning_rate,
            "step_scale": self.step_size.scale,  # recorded with the version: the next measure
        }
        if totals.get("movement_tokens"):  # the last step's, on its version's samples
            moved["movement_tokens"] = int(totals["movement_tokens"])
            moved["movement_kl"] = totals["movement_k3"] / totals["movement_tokens"]
        return {
            **means,
            **fresh,
            **moved,
            **extremes,
            "loss": loss_sum,
            "samples": len(samples),
            "trained_tokens": kept,
            "dropped_mismatch": dropped,
            "grad_norm": _item(grad_norm),
            "step_seconds": time.monotonic() - started,
        }

    def supervised_step(self, samples: list[Sample]) -> JsonObject:
        """One optimizer step of cross-entropy on the samples' masked tokens (the supervised
        stage, learner/supervised/): the mean of -log p over every masked token of the batch,
        at temperature 1 with nothing processed (the samples were rendered, not sampled).
        The same passes, precision, adapters, clipping and masters as `step`."""
        started = time.monotonic()
        self.compute.eval()
        total = sum(sum(s.loss_mask[1:]) for s in samples)  # position 0 predicts nothing
        if total == 0:
            return {"tokens": 0, "skipped": "no trainable tokens"}
        totals = {"loss": 0.0}
        for batch, counts in self._micro_batches(samples, [0.0] * len(samples)):
            tensors = self._tensors(batch)
            logprobs = self.token_logprobs(batch, tensors)
            loss = -(logprobs * tensors["mask"]).sum() / total
            if not counts:
                loss = loss * 0.0  # a pass that only keeps the other ranks company
            loss.backward()
            self._fold_grads()
            if counts:
                totals["loss"] += float(loss.detach())
        self._reduce(totals, {})
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._refresh_compute()
        return {
            "loss": totals["loss"],
            "samples": len(samples),
            "trained_tokens": total,
            "grad_norm": _item(grad_norm),
            "step_seconds": time.monotonic() - started,
        }

    def apply_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """One step of `optimizer` (over `parameters`) on the gradients a caller's own loss
        left on the compute copy (a bench's bare loop): folded into the masters, stepped,
        and the copy refreshed from them."""
        self._fold_grads()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._refresh_compute()

    def _fold_grads(self) -> None:
        """Add the compute copy's gradients (bf16) into the masters' (float32): accumulated
        over micro-batches in float32, as a sharded trainer reduces them."""
        for master, copied in self._copies:
            if copied.grad is None:
                continue
            if master.grad is None:
                master.grad = copied.grad.to(torch.float32)
            else:
                master.grad.add_(copied.grad)
            copied.grad = None

    @torch.no_grad()
    def _refresh_compute(self) -> None:
        for master, copied in self._copies:
            copied.copy_(master)

    @torch.no_grad()
    def _reference_logprobs(
        self, batch: MicroBatch, tensors: dict[str, torch.Tensor]
    ) -> torch.Tensor | None:
        if self.config.loss.kl_coef == 0:
            return None
        if self.reference is not None:
            return self._run_reference(lambda model: self._scored(model, batch, tensors))
        with self.compute.disable_adapter():  # type: ignore[operator]
            return self.token_logprobs(batch, tensors)

    @torch.no_grad()
    def logprobs_of(self, prompt: list[int], completion: list[int]) -> list[float]:
        """Logprobs of `completion` after `prompt` at temperature 1 (the publisher's probe),
        computed as the trainer computes: with the weights a checkpoint of it holds."""
        self.compute.eval()
        ids = torch.tensor([prompt + completion], device=self.device)

        def probe(model: torch.nn.Module) -> list[float]:
            with self.autocast():
                logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            all_logprobs = torch.log_softmax(logits, dim=-1)
            picked = all_logprobs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)[0]
            return picked[len(prompt) - 1 :].tolist()

        return self._run(probe)


def _fresh_figures(
    totals: dict[str, float],
    extremes: dict[str, float],
    batch: MicroBatch,
    logprobs: torch.Tensor,
    tensors: dict[str, torch.Tensor],
    mask: torch.Tensor,
    version: str,
) -> None:
    """Add the ratio and mismatch KL (k3) of the trained tokens of samples `version` alone
    produced to the step's totals and extremes."""
    fresh = torch.tensor([s.policy_versions == {version} for s in batch.samples])
    where = mask & fresh.to(mask.device).unsqueeze(-1)
    n = int(where.sum())
    if not n:
        return
    log_ratio = (logprobs.detach() - tensors["behaviour"])[where].double()
    ratio = log_ratio.exp()
    totals["fresh_tokens"] = totals.get("fresh_tokens", 0.0) + n
    totals["fresh_k3"] = totals.get("fresh_k3", 0.0) + float((ratio - 1 - log_ratio).sum())
    totals["fresh_ratio"] = totals.get("fresh_ratio", 0.0) + float(ratio.sum())
    low, high = float(ratio.min()), float(ratio.max())
    extremes["fresh_ratio_min"] = min(extremes.get("fresh_ratio_min", low), low)
    extremes["fresh_ratio_max"] = max(extremes.get("fresh_ratio_max", high), high)


def _movement(
    totals: dict[str, float],
    batch: MicroBatch,
    logprobs: torch.Tensor,
    tensors: dict[str, torch.Tensor],
    shares: Mapping[str, float],
) -> None:
    """Add the k3 estimate of KL between vLLM's logprobs and the trainer's on every trained
    token of the samples one of `shares`' versions alone produced (dropped as mismatched or
    not: those are the ones a large step moved most) to the step's totals, each token's k3
    times its version's share (the last step's part of the steps since that version:
    learner/step_size.py measured_from)."""
    share = [_share(s.policy_versions, shares) for s in batch.samples]
    device = tensors["mask"].device
    produced = torch.tensor([part > 0 for part in share], device=device)
    where = tensors["mask"] & produced.unsqueeze(-1)
    n = int(where.sum())
    if not n:
        return
    weights = torch.tensor(share, dtype=torch.float64, device=device).unsqueeze(-1)
    log_ratio = (logprobs.detach() - tensors["behaviour"]).double()
    k3 = (log_ratio.exp() - 1 - log_ratio) * weights
    totals["movement_tokens"] = totals.get("movement_tokens", 0.0) + n
    totals["movement_k3"] = totals.get("movement_k3", 0.0) + float(k3[where].sum())


def _share(produced_by: set[str], shares: Mapping[str, float]) -> float:
    """The share of the one version that produced a sample (0: none of ``shares``, or
    several versions produced it)."""
    if len(produced_by) != 1:
        return 0.0
    return shares.get(next(iter(produced_by)), 0.0)


@torch.no_grad()
def masters_and_frozen(model: torch.nn.Module) -> None:
    """Under "bfloat16": trained parameters float32 (the master weights), frozen ones
    bfloat16. A LoRA adapter's base never changes, so it needs no float32 master: it is
    held once, in the dtype vLLM serves it in, and the compute copy shares it."""
    for parameter in model.parameters():
        dtype = torch.float32 if parameter.requires_grad else torch.bfloat16
        parameter.data = parameter.data.to(dtype)


def bfloat16_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with its parameters in bfloat16, tied weights still tied, each
    parameter copied straight to bf16 (never a second float32 model; one in bf16 already is
    shared, not copied). Buffers stay as they
    are, as under FSDP's mixed precision: rounding the rotary embedding's float32
    frequencies to bf16 would move every position (vLLM computes them in float32 too)."""
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
        for p in model.parameters()
    }
    return copy.deepcopy(model, memo)


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _item(value: torch.Tensor) -> float:
    full = getattr(value, "full_tensor", None)  # a DTensor's norm: the same on every rank
    return float(full() if callable(full) else value)


def sample_logprobs(
    features: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    batch: MicroBatch,
    tensors: dict[str, torch.Tensor],
    config: TrainerConfig,
) -> torch.Tensor:
    """[B, T - 1] processed logprobs of each row's targets under its own sample's sampling,
    at the trained positions only (0 elsewhere: the loss never reads them).

    `features` [B, T, H] are what `head` turns into logits (the decoder's hidden states and
    the LM head, or the logits and the identity). Only the trained positions are taken, and
    `logprob_chunk_tokens` of them at a time go through the head and vLLM's processing,
    under activation checkpointing: their [chunk, vocab] float32 logits and processing are
    recomputed in the backward pass, never kept, so no full-vocabulary float32 tensor of a
    whole micro-batch exists.
    """
    mask = tensors["mask"]
    rows, columns = mask.nonzero(as_tuple=True)  # row-major: each sample's run is contiguous
    out = torch.zeros(mask.shape, dtype=torch.float32, device=features.device)
    if rows.numel() == 0:
        return out
    picked = features[:, : mask.shape[1]][rows, columns]
    counts = mask.sum(dim=1).tolist()
    values: list[torch.Tensor] = []
    offset = 0
    for row, sample in enumerate(batch.samples):
        n = int(counts[row])
        positions = columns[offset : offset + n]
        starts = _starts(sample, positions) if sample.sampling.penalised else None
        ids = tensors["ids"][row, : len(sample.token_ids)]
        for begin in range(0, n, config.logprob_chunk_tokens):
            end = min(begin + config.logprob_chunk_tokens, n)
            piece = functools.partial(
                _chunk_logprobs,
                head,
                sample.sampling,
                ids,
                positions[begin:end],
                None if starts is None else starts[begin:end],
                tensors["targets"][row, positions[begin:end]],
            )
            x = picked[offset + begin : offset + end]
            if torch.is_grad_enabled() and x.requires_grad:
                values.append(checkpoint(piece, x, use_reentrant=False))
            else:
                values.append(piece(x))
        offset += n
    return out.index_put((rows, columns), torch.cat(values))


def _chunk_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    sampling: Sampling,
    ids: torch.Tensor,
    positions: torch.Tensor,
    starts: torch.Tensor | None,
    targets: torch.Tensor,
    features: torch.Tensor,
) -> torch.Tensor:
    logits = head(features).float()  # vLLM too computes them in the model's dtype
    history = None
    if starts is not None:
        history = token_history(
            ids,
            positions,
            starts,
            logits.shape[-1],
            seen=sampling.repetition_penalty != 1.0,
            counts=sampling.presence_penalty != 0.0 or sampling.frequency_penalty != 0.0,
        )
    return processed_logprobs(logits, targets, sampling, history)


def _identity(features: torch.Tensor) -> torch.Tensor:
    return features


def output_head(
    model: torch.nn.Module,
) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, head) of a causal LM whose logits are exactly head(decoder(...) hidden
    states), as for Qwen2, Llama and Mistral; None when its forward does more (Gemma's
    final soft-capping, a logits scale) or the parts cannot be found."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    config = getattr(model, "config", None)
    if get_decoder is None or get_head is None or config is None:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    if getattr(config, "logits_scaling", 1.0) != 1.0:
        return None
    decoder, head = get_decoder(), get_head()
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        return None
    return decoder, head


def checkpoint_layers(model: torch.nn.Module) -> int:
    """Activation checkpointing: each decoder layer (the model's `_no_split_modules`)
    recomputes its activations in the backward pass. Parameter names stay as they are (no
    wrapper module), so checkpoints and vLLM see the same weights. How many were wrapped."""
    kinds = set(getattr(model, "_no_split_modules", None) or ())
    wrapped = 0
    for module in model.modules():
        if type(module).__name__ in kinds:
            module.forward = functools.partial(_checkpointed, module.forward)  # type: ignore[method-assign]
            wrapped += 1
    if not wrapped:
        raise ValueError(f"no decoder layers ({sorted(kinds)}) to checkpoint in the model")
    return wrapped


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def _starts(sample: Sample, positions: torch.Tensor) -> torch.Tensor:
    """Where the output of the call that sampled each position's target begins."""
    start_of = [0] * len(sample.token_ids)
    for start, end in sample.completions:
        start_of[start:end] = [start] * (end - start)
    return torch.tensor(start_of, device=positions.device)[positions + 1]


def _has_adapter(model: torch.nn.Module) -> bool:
    return callable(getattr(model, "disable_adapter", None))


def _accumulate(
    sums: dict[str, float], extremes: dict[str, float], metrics: dict[str, float], tokens: int
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
