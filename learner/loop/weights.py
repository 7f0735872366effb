"""The trainer's weights and optimizer state: built from a checkpoint (full, LoRA, sharded),
saved beside it, loaded for a resume."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from learner.checkpoint import load_model
from learner.layout import adapter_base, is_adapter, served_base
from learner.loop.base import PROBE_TEXT, LearnerBase
from learner.lora import load_trainable, merge, wrap
from learner.shared_base import share_frozen
from learner.swap.publisher import ExpectedLogprobs, Probe
from learner.trainer import Trainer, TrainerConfig, trainer_device

log = logging.getLogger("onthejob.learner")


class Weights(LearnerBase):
    """The trainer from a checkpoint, and its optimizer state."""

    def _trainer(self, source: Path) -> Trainer:
        if self.ranks is not None:
            # every rank builds its shard of the trainer from the checkpoint
            base = self.checkpoints / "base" if self.trainer_config.loss.kl_coef > 0 else None
            return self.ranks.build(source, self.trainer_config, base)  # type: ignore[return-value]
        model: torch.nn.Module
        if self.config.lora:
            # under bf16 the frozen base is loaded as it is served, never in float32
            bf16 = self.trainer_config.precision == "bfloat16"
            base_dtype = torch.bfloat16 if bf16 else torch.float32
            # an adapter trains on; full weights get a fresh adapter (B = 0: same policy)
            model = (
                load_trainable(source, base_dtype)
                if is_adapter(source)
                else wrap(load_model(source, base_dtype), self.lora_settings)
            )
            # the tenants' trainers (and a trainer built while the last one lives) hold
            # one copy of the base between them
            model = model.to(trainer_device(self.config.device))
            shared = share_frozen(model, adapter_base(source) if is_adapter(source) else source)
            if shared:
                log.info("trainer: its frozen base is shared, %.0f MB not held twice", shared / 1e6)
        elif is_adapter(source):
            model = merge(load_trainable(source))  # LoRA switched off: train its merged weights
        else:
            model = load_model(source)
        # the KL term (kl_coef > 0) anchors to the base model, version 0; a LoRA model's
        # own base (adapter off) is that anchor when it was trained from version 0
        reference = None
        if self.trainer_config.loss.kl_coef > 0 and not self.config.lora:
            reference = load_model(self.checkpoints / "base")
        return Trainer(model, self.trainer_config, self.config.device, reference)

    @staticmethod
    def _optimizer_path(checkpoint: Path) -> Path:
        # beside the directory vLLM loads, never inside it
        return checkpoint.with_name(checkpoint.name + ".optimizer.pt")

    def _save_optimizer(self, checkpoint: Path) -> None:
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        # AdamW's moments and, under bf16, the float32 master weights
        torch.save(self.trainer.training_state(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def _load_optimizer(self, checkpoint: Path) -> None:
        """AdamW moments of that checkpoint, so a resumed run continues the same run; the
        learning rate stays the one the operator or the command line set (the saved state
        carries the rate it was saved with)."""
        assert self.trainer is not None
        path = self._optimizer_path(checkpoint)
        if not path.exists() and self.step > 0:
            # written every --optimizer-state-every steps and at a clean stop: after a crash
            # (or a failed publish) the run goes on from the checkpoint's weights
            log.warning(
                "no optimizer state beside %s (--optimizer-state-every %d; and at a clean "
                "stop): AdamW moments start afresh%s",
                checkpoint.name,
                self.config.optimizer_state_every,
                ", from its bf16 weights" if self.trainer_config.precision == "bfloat16" else "",
            )
        if path.exists():
            try:
                self.trainer.load_training_state(torch.load(path, weights_only=True))
            except ValueError as exc:
                # saved for other parameters (LoRA switched on or off): start the moments anew
                log.warning("optimizer state %s does not fit (%s); starting afresh", path, exc)
        self.trainer.set_learning_rate(self.config.learning_rate)

    def _save_optimizer_at_stop(self) -> None:
        """The serving checkpoint's optimizer state, if no step wrote it (they do every
        --optimizer-state-every steps): a restart after a clean stop continues the same run.
        Only while the trainer holds exactly that checkpoint's state: a stop that came
        mid-step (or mid-reload) must not pass a step nobody recorded off as the serving
        one's. Not for version 0 (nothing trained yet), nor under FSDP (its ranks are gone)."""
        if not self._trainer_is_serving or self.ranks is not None:
            return
        assert self.trainer is not None and self.serving is not None
        checkpoint = Path(self.serving["checkpoint_path"])
        if (
            not self.serving["ordinal"]
            or not checkpoint.is_dir()
            or self._optimizer_path(checkpoint).exists()
        ):
            return
        try:
            started = time.monotonic()
            self._save_optimizer(checkpoint)
            log.info(
                "optimizer state of %s saved in %.1fs", checkpoint.name, time.monotonic() - started
            )
        except Exception as exc:  # a stop goes on; a resume says what it lacks
            log.warning("could not save the optimizer state at stop: %s", exc)


def expected_for(checkpoint: Path) -> tuple[Probe, ExpectedLogprobs]:
    """`onthejob rollback` of a version recorded before probes were kept: its model, loaded,
    and the learner's probe for it."""
    from transformers import AutoTokenizer

    weights = load_trainable(checkpoint) if is_adapter(checkpoint) else load_model(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(served_base(checkpoint)))
    probe = Probe(prompt_token_ids=list(tokenizer(PROBE_TEXT)["input_ids"]))
    return probe, Trainer(weights, TrainerConfig(), None).logprobs_of
