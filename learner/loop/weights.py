"""The trainer's weights and optimizer state: built from a checkpoint (full, LoRA, sharded),
saved beside it, loaded for a resume; and the trainer following what serves."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from learner.adapter_bank import AdapterBanks
from learner.adapter_trainer import AdapterTrainer
from learner.checkpoint import load_model
from learner.layout import adapter_base, is_adapter, served_base
from learner.loop.state import PROBE_TEXT, LoopState
from learner.lora import load_trainable, merge, wrap
from learner.shared_base import share_frozen
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import ExpectedLogprobs, Fingerprint, Probe
from learner.trainer import Trainer, TrainerConfig, trainer_device
from store.policy_versions import PolicyVersionRow

log = logging.getLogger("onthejob.learner")


class Weights:
    """The lineage's trainer, built from a checkpoint, and its optimizer state."""

    def __init__(self, state: LoopState) -> None:
        self.state = state
        # --tenants: every tenant's adapter on one frozen base (learner/adapter_bank.py)
        self.banks = AdapterBanks()

    def build(self, source: Path) -> Trainer:
        """A trainer holding the checkpoint's weights (no optimizer state yet)."""
        state, config = self.state, self.state.config
        if state.ranks is not None:
            # every rank builds its shard of the trainer from the checkpoint
            kl = state.trainer_config.loss.kl_coef > 0
            base = state.checkpoints / "base" if kl else None
            return state.ranks.build(source, state.trainer_config, base)  # type: ignore[return-value]
        if config.lora and state.tenant is not None:
            return self.tenant_trainer(source)
        model: torch.nn.Module
        if config.lora:
            # under bf16 the frozen base is loaded as it is served, never in float32
            bf16 = state.trainer_config.precision == "bfloat16"
            base_dtype = torch.bfloat16 if bf16 else torch.float32
            # an adapter trains on; full weights get a fresh adapter (B = 0: same policy)
            model = (
                load_trainable(source, base_dtype)
                if is_adapter(source)
                else wrap(load_model(source, base_dtype), state.lora_settings)
            )
            # the tenants' trainers (and a trainer built while the last one lives) hold
            # one copy of the base between them
            model = model.to(trainer_device(config.device))
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
        if state.trainer_config.loss.kl_coef > 0 and not config.lora:
            reference = load_model(state.checkpoints / "base")
        return Trainer(model, state.trainer_config, config.device, reference)

    def tenant_trainer(self, source: Path) -> Trainer:
        """The tenant's trainer: an adapter slot of its own on the one frozen base the
        tenants' adapters share; its old slot, if any, goes once the new one is in."""
        state, tenant = self.state, self.state.tenant
        assert tenant is not None
        bf16 = state.trainer_config.precision == "bfloat16"
        base_dtype = torch.bfloat16 if bf16 else torch.float32
        device = trainer_device(state.config.device)
        bank, slot = self.banks.take(tenant, source, state.lora_settings, base_dtype, device)
        if len(bank.slots) > 1:
            log.info(
                "trainer: tenant %s's adapter is one of %d on one model: its frozen base is shared",
                tenant,
                len(bank.slots),
            )
        return AdapterTrainer(bank, slot, state.trainer_config, device)

    def release(self, tenant: str) -> None:
        """A deleted tenant's adapter slot freed."""
        self.banks.release(tenant)

    def load(self, source: Path) -> None:
        """The lineage's trainer on the checkpoint's weights and optimizer state: what serves."""
        lineage = self.state.lineage
        lineage.trainer_is_serving = False
        before = lineage.trainer
        lineage.trainer = self.build(source)
        if before is not None:  # the rate's scale is the lineage's, not these weights'
            lineage.trainer.step_size = before.step_size
        self.load_optimizer(source)
        lineage.trainer_is_serving = True

    def reload(self) -> None:
        """Back to the serving weights and their optimizer state (a step nobody recorded)."""
        serving = self.state.lineage.serving
        assert serving is not None
        self.load(Path(serving["checkpoint_path"]))

    def follow(self, serving: PolicyVersionRow, by: str = "an operator") -> None:
        """What serves changed under us (an operator, the guard): the trainer and the
        publisher's idea of the last good weights move to it."""
        log.info("now serving %s (changed by %s); training from it", serving["version"], by)
        lineage = self.state.lineage
        source = Path(serving["checkpoint_path"])
        self.load(source)
        lineage.serving = serving
        if lineage.publisher is not None:
            lineage.publisher.last_good = served_base(source).resolve()
            lineage.publisher.last_good_fingerprint = Fingerprint.from_state(
                serving["probe"], at_least=self.state.tolerance
            )
            if isinstance(lineage.publisher, FullWeightPublisher):
                # what serves changed on every replica, a candidate's with the others
                lineage.publisher.canary_replicas = []
                lineage.publisher.last_good_label = serving["version"]

    @staticmethod
    def optimizer_path(checkpoint: Path) -> Path:
        # beside the directory vLLM loads, never inside it
        return checkpoint.with_name(checkpoint.name + ".optimizer.pt")

    def save_optimizer(self, checkpoint: Path) -> None:
        trainer = self.state.lineage.trainer
        assert trainer is not None
        path = self.optimizer_path(checkpoint)
        # AdamW's moments and, under bf16, the float32 master weights
        torch.save(trainer.training_state(), path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)

    def load_optimizer(self, checkpoint: Path) -> None:
        """AdamW moments of that checkpoint, so a resumed run continues the same run; the
        learning rate stays the one the operator or the command line set (the saved state
        carries the rate it was saved with)."""
        state, trainer = self.state, self.state.lineage.trainer
        assert trainer is not None
        path = self.optimizer_path(checkpoint)
        if not path.exists() and state.step > 0:
            # written every --optimizer-state-every steps and at a clean stop: after a crash
            # (or a failed publish) the run goes on from the checkpoint's weights
            log.warning(
                "no optimizer state beside %s (--optimizer-state-every %d; and at a clean "
                "stop): AdamW moments start afresh%s",
                checkpoint.name,
                state.config.optimizer_state_every,
                ", from its bf16 weights" if state.trainer_config.precision == "bfloat16" else "",
            )
        if path.exists():
            try:
                trainer.load_training_state(torch.load(path, weights_only=True))
            except ValueError as exc:
                # saved for other parameters (LoRA switched on or off): start the moments anew
                log.warning("optimizer state %s does not fit (%s); starting afresh", path, exc)
        trainer.set_learning_rate(state.config.learning_rate)

    def save_optimizer_at_stop(self) -> None:
        """The serving checkpoint's optimizer state, if no step wrote it (they do every
        --optimizer-state-every steps): a restart after a clean stop continues the same run.
        Only while the trainer holds exactly that checkpoint's state: a stop that came
        mid-step (or mid-reload) must not pass a step nobody recorded off as the serving
        one's. Not for version 0 (nothing trained yet), nor under FSDP (its ranks are gone)."""
        lineage = self.state.lineage
        if not lineage.trainer_is_serving or self.state.ranks is not None:
            return
        assert lineage.trainer is not None and lineage.serving is not None
        checkpoint = Path(lineage.serving["checkpoint_path"])
        if (
            not lineage.serving["ordinal"]
            or not checkpoint.is_dir()
            or self.optimizer_path(checkpoint).exists()
        ):
            return
        try:
            started = time.monotonic()
            self.save_optimizer(checkpoint)
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
