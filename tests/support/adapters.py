"""A LoRA adapter trained a few steps away from its base."""

from __future__ import annotations

from pathlib import Path

import torch

from learner.checkpoint import load_model
from learner.lora import LoraSettings, save_adapter, wrap
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

RANK = 8


PROMPT_IDS = [1, 20, 30, 40, 50]


def trained_adapter(
    base: Path,
    out: Path,
    precision: str = "float32",
    learning_rate: float = 5e-2,
    seed: int = 0,
) -> Trainer:
    """An adapter a few steps away from the base, saved to ``out`` (as the learner saves it:
    under "bfloat16", the bf16 copy the trainer computes with, on the bf16 base). ``seed``:
    where its A matrices start; two adapters meant to differ take two seeds, or two rates."""
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    with torch.random.fork_rng():
        # the same adapter whatever ran before: its A matrices start random, and how much
        # each layer moves the probe depends on them (one order of tests made a layer's
        # part too small for the bf16 probe to notice it left out)
        torch.manual_seed(seed)
        model = wrap(load_model(base, dtype), LoraSettings(rank=RANK, alpha=2 * RANK))
    config = TrainerConfig(learning_rate=learning_rate, precision=precision)
    trainer = Trainer(model, config, device="cpu")
    completion = [60, 70, 80, 90]
    for _ in range(3):
        sample = Sample(
            trajectory_id="t",
            token_ids=PROMPT_IDS + completion,
            loss_mask=[False] * len(PROMPT_IDS) + [True] * len(completion),
            logprobs=[0.0] * len(PROMPT_IDS) + trainer.logprobs_of(PROMPT_IDS, completion),
        )
        trainer.step([sample], [1.0])
    save_adapter(trainer.served_model, out, base_dir=base)  # type: ignore[arg-type]
    return trainer
