"""`Trainer.supervised_step`: cross-entropy, the mean over the masked tokens alone; a token
outside the mask changes neither the loss nor the update; steps lower the loss."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    from learner.checkpoint import load_model
    from learner.tiny_model import build_tiny_model

    return load_model(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0))


def _sample(ids: list[int], mask: list[bool]) -> Sample:
    return Sample(trajectory_id="t", token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids))


IDS = [1, 10, 20, 30, 40, 50, 60, 70]
MASK = [False, False, False, True, True, False, True, False]


def test_the_loss_is_the_mean_cross_entropy_of_the_masked_tokens(model: torch.nn.Module) -> None:
    trainer = Trainer(copy.deepcopy(model), TrainerConfig(learning_rate=1e-3), device="cpu")
    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([IDS])).logits[0, :-1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(IDS[1:])[:, None])
    masked = [float(-logprobs[t - 1]) for t in range(1, len(IDS)) if MASK[t]]
    metrics = trainer.supervised_step([_sample(IDS, MASK)])
    assert metrics["loss"] == pytest.approx(sum(masked) / len(masked), rel=1e-5)
    assert metrics["trained_tokens"] == 3 and metrics["grad_norm"] > 0


def test_a_token_outside_the_mask_changes_neither_loss_nor_update(model: torch.nn.Module) -> None:
    other = [*IDS[:-1], 99]  # the last token is outside the mask: only its target differs
    results = []
    for ids in (IDS, other):
        trainer = Trainer(copy.deepcopy(model), TrainerConfig(learning_rate=1e-3), device="cpu")
        metrics = trainer.supervised_step([_sample(ids, MASK)])
        results.append((metrics["loss"], trainer.master_state()))
    (loss_a, weights_a), (loss_b, weights_b) = results
    assert loss_a == loss_b
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
    # while a masked token's target does change them
    trainer = Trainer(copy.deepcopy(model), TrainerConfig(learning_rate=1e-3), device="cpu")
    changed = [*IDS[:6], 98, *IDS[7:]]
    assert trainer.supervised_step([_sample(changed, MASK)])["loss"] != loss_a


def test_steps_lower_the_loss_in_float32_and_bf16(model: torch.nn.Module, tmp_path: Path) -> None:
    for precision in ("float32", "bfloat16"):
        config = TrainerConfig(learning_rate=1e-2, precision=precision)
        trainer = Trainer(copy.deepcopy(model), config, device="cpu")
        losses = [float(trainer.supervised_step([_sample(IDS, MASK)])["loss"]) for _ in range(5)]
        assert losses[-1] < losses[0] * 0.8, (precision, losses)


def test_no_masked_token_is_no_step(model: torch.nn.Module) -> None:
    trainer = Trainer(copy.deepcopy(model), TrainerConfig(), device="cpu")
    metrics = trainer.supervised_step([_sample(IDS, [True] + [False] * 7)])
    assert metrics == {"tokens": 0, "skipped": "no trainable tokens"}


def test_under_lora_it_trains_the_adapter_alone(model: torch.nn.Module) -> None:
    from learner.lora import LoraSettings, wrap

    trainer = Trainer(
        wrap(copy.deepcopy(model), LoraSettings(rank=4, alpha=8)),
        TrainerConfig(learning_rate=1e-2),
        device="cpu",
    )
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    losses = [float(trainer.supervised_step([_sample(IDS, MASK)])["loss"]) for _ in range(5)]
    assert losses[-1] < losses[0], losses
    moved = {
        name
        for name, parameter in trainer.model.named_parameters()
        if not torch.equal(parameter.detach(), frozen[name])
    }
    assert moved and all("lora_" in name for name in moved)  # the base never moves
