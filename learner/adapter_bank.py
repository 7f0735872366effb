"""One frozen base under several tenants' LoRA adapters (`learn --lora --tenants`).

Each tenant's trainer was a model of its own: its own modules, its own compute copy, the
base's tensors shared at best (learner/shared_base.py). A bank is one peft model on one
base holding an adapter per slot (peft's multi-adapter API); a tenant's trainer
(learner/adapter_trainer.py) owns one slot and activates it for each of its passes, so only
its adapter computes and only its adapter's parameters get gradients. A tenant on another
base (its lineage started from other full weights) gets a bank of its own.

A slot is never changed in place by a load: a tenant's trainer built again (a rollback, a
restore, following an operator) takes a new slot, and its old one is dropped only once the
new one loaded, so a load that fails leaves the tenant's trainer as it was.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model

from learner.checkpoint import load_model
from learner.layout import adapter_base, is_adapter
from learner.lora import LoraSettings, lora_config
from learner.shared_base import share_frozen
from learner.trainer import checkpoint_layers


@dataclass(frozen=True)
class BankKey:
    """What makes two bases one: the directory (and its identity: a directory written again
    under the same path is another base), and the dtype and device the base is held in."""

    base: str
    identity: tuple[int, int, int]
    dtype: torch.dtype
    device: str

    @classmethod
    def of(cls, base_dir: Path, dtype: torch.dtype, device: str) -> BankKey:
        base = Path(base_dir).resolve()
        info = base.stat()
        return cls(str(base), (info.st_dev, info.st_ino, info.st_mtime_ns), dtype, device)


def base_of(source: Path) -> Path:
    """The full checkpoint a trainer built from `source` adapts: the base an adapter names,
    or `source` itself (full weights get a fresh adapter)."""
    return adapter_base(source) if is_adapter(source) else source


class AdapterBank:
    """One base (a peft model) and the adapters of its slots."""

    def __init__(self, key: BankKey) -> None:
        self.key = key
        self.model: PeftModel | None = None
        self.slots: dict[str, list[torch.nn.Parameter]] = {}  # slot -> its adapter's
        self.active: str | None = None
        self.checkpointed = False
        self._names = (f"slot{n}" for n in itertools.count())

    def add(self, source: Path, settings: LoraSettings) -> str:
        """A new slot holding `source`'s adapter (trainable, float32 as peft makes it), or a
        fresh one under `settings` where `source` is full weights; its name."""
        slot = next(self._names)
        base_dir = Path(self.key.base)
        if self.model is None:
            base = load_model(base_dir, self.key.dtype).to(self.key.device)
            if is_adapter(source):
                loaded = PeftModel.from_pretrained(
                    base, str(source), adapter_name=slot, is_trainable=True
                )
            else:
                loaded = get_peft_model(base, lora_config(settings), adapter_name=slot)
            # the shared policy's trainer (which --tenants keeps) lends its base tensors
            share_frozen(loaded, base_dir)
            self.model = loaded.eval()
        elif is_adapter(source):
            self.model.load_adapter(str(source), adapter_name=slot, is_trainable=True)
        else:
            self.model.add_adapter(slot, lora_config(settings))
        self.model.to(self.key.device)  # no-op for what is there; the new adapter's tensors
        self.slots[slot] = [p for name, p in self.model.named_parameters() if _of(name, slot)]
        self._frozen_base()
        self.active = None  # peft may have moved it
        return slot

    def activate(self, slot: str) -> PeftModel:
        """The model with `slot`'s adapter the only one computing."""
        assert self.model is not None and slot in self.slots
        if self.active != slot:
            self.model.set_adapter(slot)
            # peft froze the others: every adapter stays trainable, so its trainer's view
            # of its parameters never changes (an inactive adapter is not computed at all,
            # so it gets no gradient)
            for parameters in self.slots.values():
                for parameter in parameters:
                    parameter.requires_grad_(True)
            self.active = slot
        return self.model

    def drop(self, slot: str) -> None:
        """The slot's adapter out of the model; the last one out frees the base too."""
        if self.slots.pop(slot, None) is None:
            return
        if self.active == slot:
            self.active = None
        if not self.slots:
            self.model = None
            return
        assert self.model is not None
        with warnings.catch_warnings():
            # peft warns when the active adapter goes: the next pass activates its own
            warnings.simplefilter("ignore")
            self.model.delete_adapter(slot)

    def checkpoint_layers(self) -> None:
        """Activation checkpointing of the shared model's decoder layers, once."""
        if not self.checkpointed and self.model is not None:
            checkpoint_layers(self.model)
            self.checkpointed = True

    def _frozen_base(self) -> None:
        assert self.model is not None
        adapters = {id(p) for parameters in self.slots.values() for p in parameters}
        for parameter in self.model.parameters():
            parameter.requires_grad_(id(parameter) in adapters)


def _of(name: str, slot: str) -> bool:
    """Whether a parameter of the peft model belongs to `slot`'s adapter
    (`...q_proj.lora_A.SLOT.weight`)."""
    return slot in name.split(".")


class AdapterBanks:
    """The live banks, one per base, and the slot each owner (a tenant) holds."""

    def __init__(self) -> None:
        self.banks: dict[BankKey, AdapterBank] = {}
        self.owned: dict[str, tuple[AdapterBank, str]] = {}

    def take(
        self, owner: str, source: Path, settings: LoraSettings, dtype: torch.dtype, device: str
    ) -> tuple[AdapterBank, str]:
        """A new slot for `owner` holding `source`'s adapter (or a fresh one on it); the
        owner's old slot is dropped once the new one is in."""
        key = BankKey.of(base_of(source), dtype, device)
        bank = self.banks.get(key) or AdapterBank(key)
        slot = bank.add(source, settings)
        self.banks[key] = bank
        self.release(owner)
        self.owned[owner] = (bank, slot)
        return bank, slot

    def release(self, owner: str) -> None:
        """The owner's slot dropped (a tenant deleted, or its trainer built again)."""
        held = self.owned.pop(owner, None)
        if held is None:
            return
        bank, slot = held
        bank.drop(slot)
        if bank.model is None:
            with contextlib.suppress(KeyError):
                del self.banks[bank.key]
