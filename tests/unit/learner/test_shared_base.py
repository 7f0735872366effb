"""Trainers on one base share its frozen tensors (the tenants' trainers), on the tiny model."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path

import pytest
import torch

from learner.checkpoint import load_model
from learner.lora import LoraSettings, wrap
from learner.shared_base import share_frozen
from learner.tiny_model import build_tiny_model
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

PROMPT, COMPLETION = [1, 10, 20, 30], [40, 50, 60]


def adapter_on(base_dir: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return wrap(load_model(base_dir, dtype), LoraSettings(rank=4, alpha=8))


def frozen(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if not p.requires_grad}


def step(trainer: Trainer) -> None:
    sample = Sample(
        trajectory_id="t",
        token_ids=PROMPT + COMPLETION,
        loss_mask=[False] * len(PROMPT) + [True] * len(COMPLETION),
        logprobs=[0.0] * len(PROMPT) + trainer.logprobs_of(PROMPT, COMPLETION),
    )
    trainer.step([sample], [1.0])


def test_a_second_model_on_the_base_holds_no_copy_of_it_and_answers_the_same(
    tmp_path: Path,
) -> None:
    base = build_tiny_model(tmp_path / "base", seed=0)
    first, second = adapter_on(base), adapter_on(base)
    assert share_frozen(first, base) == 0  # the first offers its base
    saved = share_frozen(second, base)
    base_bytes = sum(p.numel() * p.element_size() for p in frozen(first).values())
    assert saved == base_bytes > 0
    for name, parameter in frozen(second).items():
        assert parameter.data_ptr() == frozen(first)[name].data_ptr(), name
    # the adapters stay each model's own
    trained = {n: p for n, p in second.named_parameters() if p.requires_grad}
    assert trained and all(
        p.data_ptr() != dict(first.named_parameters())[n].data_ptr() for n, p in trained.items()
    )

    # one trains: the other answers as before, and as a model that shares nothing
    alone = Trainer(adapter_on(base), TrainerConfig(), "cpu")
    one = Trainer(first, TrainerConfig(learning_rate=5e-2), "cpu")
    other = Trainer(second, TrainerConfig(), "cpu")
    before = other.logprobs_of(PROMPT, COMPLETION)
    step(one)
    step(one)
    assert one.logprobs_of(PROMPT, COMPLETION) != pytest.approx(before, abs=1e-4)
    assert other.logprobs_of(PROMPT, COMPLETION) == before
    assert before == pytest.approx(alone.logprobs_of(PROMPT, COMPLETION), abs=0)


def test_the_base_outlives_the_model_that_loaded_it_and_nothing_else_is_shared(
    tmp_path: Path,
) -> None:
    base = build_tiny_model(tmp_path / "base", seed=0)
    first = adapter_on(base)
    share_frozen(first, base)
    second = adapter_on(base)
    assert share_frozen(second, base) > 0
    del first
    gc.collect()
    third = adapter_on(base)  # shares with the second, which holds the base now
    assert share_frozen(third, base) > 0
    # another dtype, or another base, is another set of tensors
    assert share_frozen(adapter_on(base, torch.bfloat16), base) == 0
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert share_frozen(adapter_on(other), other) == 0
    # a base written again under the same path is another base
    shutil.rmtree(base)
    build_tiny_model(tmp_path / "rewritten", seed=2).rename(base)
    assert share_frozen(adapter_on(base), base) == 0
