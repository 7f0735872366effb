"""A tenant's trainer on a shared base: its slot's adapter in an `AdapterBank`.

It is a `Trainer` (learner/trainer.py) whose forward and backward passes run on the bank's
model with the slot's adapter active, and whose own state is the slot's alone: the trained
parameters (under "bfloat16" precision float32 masters of the slot's bf16 adapter, as a
trainer of its own model keeps them), an optimizer over them only, and a module of them under
the names a single-adapter model gives them (`...lora_A.default.weight`). So its optimizer
state and masters save and load exactly as a tenant's own trainer's did (either reads the
other's), and the adapter it publishes is written with the same files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from learner.adapter_bank import AdapterBank
from learner.trainer import Trainer, TrainerConfig, trainer_device

SAVED_NAME = "default"  # the adapter's name in a model of its own: its saved state's names


class AdapterTrainer(Trainer):
    def __init__(
        self, bank: AdapterBank, slot: str, config: TrainerConfig, device: str | None = None
    ) -> None:
        """The trainer of `slot`'s adapter in `bank`, whose model is on `device` already."""
        self.device = trainer_device(device)
        self.config = config
        self.bank, self.slot = bank, slot
        self.compute = bank.activate(slot)
        if config.activation_checkpointing:
            bank.checkpoint_layers()
        self.reference = None  # the KL reference is the base: every adapter switched off
        own = {id(p) for p in bank.slots[slot]}
        named = [(n, p) for n, p in self.compute.named_parameters() if id(p) in own]
        if config.precision == "bfloat16":
            # the slot's adapter is the bf16 copy computed with, its masters float32 here
            masters = [_master(p) for _, p in named]
            for _, parameter in named:
                parameter.data = parameter.data.to(torch.bfloat16)
            self._copies = [(m, p) for m, (_, p) in zip(masters, named, strict=True)]
        else:
            masters = [p for _, p in named]
            self._copies = []
        self.parameters = masters
        self.model = named_module(
            [(saved_name(n, slot), m) for (n, _), m in zip(named, masters, strict=True)]
        )
        self._start_optimizer(config)

    @property
    def served_model(self) -> torch.nn.Module:
        """The bank's model with this slot's adapter active: `save_adapter` writes it."""
        return self.bank.activate(self.slot)

    def _run(self, work: Callable[[torch.nn.Module], Any]) -> Any:
        return work(self.bank.activate(self.slot))


def _master(parameter: torch.nn.Parameter) -> torch.nn.Parameter:
    return torch.nn.Parameter(parameter.detach().to(torch.float32).clone())


def saved_name(name: str, slot: str) -> str:
    """A slot's parameter under the name it has in a model of its own adapter alone."""
    return ".".join(SAVED_NAME if part == slot else part for part in name.split("."))


def named_module(named: list[tuple[str, torch.nn.Parameter]]) -> torch.nn.Module:
    """A module holding `named`'s parameters at their dotted names: what the trainer's
    optimizer state and masters are saved and loaded by."""
    root = torch.nn.Module()
    for name, parameter in named:
        *path, leaf = name.split(".")
        module = root
        for part in path:
            child = module._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                module.add_module(part, child)
            module = child
        module.register_parameter(leaf, parameter)
    return root
