"""LoRA training and adapter checkpoints, on the tiny model (CPU, no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from learner.checkpoint import load_model
from learner.layout import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CheckpointError,
    adapter_base,
    is_adapter,
)
from learner.lora import (
    LoraSettings,
    load_trainable,
    merge,
    save_adapter,
    validate_adapter,
    wrap,
    write_adapter,
)
from learner.loss import LossConfig
from learner.tiny_model import build_tiny_model
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

PROMPT, COMPLETION = [1, 10, 20, 30], [40, 50, 60]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "base", seed=0)


def rewarded(trainer: Trainer) -> Sample:
    return Sample(
        trajectory_id="t",
        token_ids=PROMPT + COMPLETION,
        loss_mask=[False] * len(PROMPT) + [True] * len(COMPLETION),
        logprobs=[0.0] * len(PROMPT) + trainer.logprobs_of(PROMPT, COMPLETION),
    )


def trained(base_dir: Path, steps: int = 2, **config: object) -> Trainer:
    model = wrap(load_model(base_dir), LoraSettings(rank=4, alpha=8))
    trainer = Trainer(model, TrainerConfig(learning_rate=5e-2, **config), device="cpu")  # type: ignore[arg-type]
    for _ in range(steps):
        trainer.step([rewarded(trainer)], [1.0])
    return trainer


def test_a_fresh_adapter_leaves_the_policy_as_it_was(base_dir: Path) -> None:
    plain = Trainer(load_model(base_dir), TrainerConfig(), device="cpu")
    wrapped = Trainer(wrap(load_model(base_dir), LoraSettings(rank=4)), TrainerConfig(), "cpu")
    assert wrapped.logprobs_of(PROMPT, COMPLETION) == pytest.approx(
        plain.logprobs_of(PROMPT, COMPLETION), abs=1e-6
    )


def test_a_step_trains_the_adapter_only_and_moves_the_policy(base_dir: Path) -> None:
    base = {n: p.detach().clone() for n, p in load_model(base_dir).named_parameters()}
    model = wrap(load_model(base_dir), LoraSettings(rank=4, alpha=8))
    trainer = Trainer(model, TrainerConfig(learning_rate=5e-2), device="cpu")
    before = trainer.logprobs_of(PROMPT, COMPLETION)
    # the optimizer holds the adapter's parameters, nothing of the base
    assert trainer.parameters and all(
        "lora_" in n for n, p in model.named_parameters() if p.requires_grad
    )
    metrics = trainer.step([rewarded(trainer)], [1.0])
    assert metrics["trained_tokens"] == len(COMPLETION) and metrics["grad_norm"] > 0
    assert sum(trainer.logprobs_of(PROMPT, COMPLETION)) > sum(before)
    for name, parameter in model.get_base_model().named_parameters():
        if "lora_" not in name:
            key = name.replace(".base_layer", "")
            assert torch.equal(parameter, base[key]), name


def test_an_adapter_checkpoint_reloads_to_the_same_policy(base_dir: Path, tmp_path: Path) -> None:
    trainer = trained(base_dir)
    out = save_adapter(trainer.model, tmp_path / "step-1", base_dir=base_dir)  # type: ignore[arg-type]
    assert is_adapter(out) and not is_adapter(base_dir)
    assert sorted(p.name for p in out.iterdir()) == [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
    assert adapter_base(out) == base_dir.resolve()
    validate_adapter(out, max_rank=4)
    reloaded = Trainer(load_trainable(out), TrainerConfig(), device="cpu")
    expected = trainer.logprobs_of(PROMPT, COMPLETION)
    assert reloaded.logprobs_of(PROMPT, COMPLETION) == pytest.approx(expected, abs=1e-6)
    # and it trains on: the reloaded adapter is trainable, the base is not
    assert reloaded.parameters and all(p.requires_grad for p in reloaded.parameters)
    # merged into full weights (LoRA switched off), the policy is the same
    plain = Trainer(merge(load_trainable(out)), TrainerConfig(), device="cpu")
    assert plain.logprobs_of(PROMPT, COMPLETION) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(FileExistsError):
        save_adapter(trainer.model, out, base_dir=base_dir)  # type: ignore[arg-type]


def test_write_adapter_fills_a_directory_with_the_files_save_adapter_writes(
    base_dir: Path, tmp_path: Path
) -> None:
    """What the memory copy vLLM loads holds (learner/swap/adapter_memory.py): the checkpoint's
    files, byte for byte."""
    model = trained(base_dir, steps=1).model
    saved = save_adapter(model, tmp_path / "saved", base_dir=base_dir)  # type: ignore[arg-type]
    (tmp_path / "written").mkdir()
    write_adapter(model, tmp_path / "written", base_dir=base_dir)  # type: ignore[arg-type]
    assert {p.name: p.read_bytes() for p in (tmp_path / "written").iterdir()} == {
        p.name: p.read_bytes() for p in saved.iterdir()
    }


def test_adapters_vllm_could_not_load_are_refused(base_dir: Path, tmp_path: Path) -> None:
    out = save_adapter(trained(base_dir, steps=1).model, tmp_path / "a", base_dir=base_dir)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="exceeds --max-lora-rank 2"):
        validate_adapter(out, max_rank=2)
    tensors = load_file(str(out / ADAPTER_WEIGHTS))
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(out / ADAPTER_WEIGHTS))
    with pytest.raises(CheckpointError, match="NaN"):
        validate_adapter(out)
    (out / ADAPTER_WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="unreadable adapter weights"):
        validate_adapter(out)
    config = json.loads((out / ADAPTER_CONFIG).read_text())
    config.pop("base_model_name_or_path")
    (out / ADAPTER_CONFIG).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="names no base model"):
        validate_adapter(out)


def test_the_kl_reference_of_an_adapter_is_its_base(base_dir: Path) -> None:
    with pytest.raises(ValueError, match="reference"):
        Trainer(load_model(base_dir), TrainerConfig(loss=LossConfig(kl_coef=0.5)), "cpu")
    # no reference model needed: the adapter switched off is the base policy
    trainer = trained(base_dir, steps=3, loss=LossConfig(kl_coef=0.5))
    metrics = trainer.step([rewarded(trainer)], [1.0])
    assert metrics["kl"] > 0  # the policy has moved away from the base


def test_bf16_trains_float32_adapter_masters_on_a_bf16_base_held_once(
    base_dir: Path, tmp_path: Path
) -> None:
    config = TrainerConfig(learning_rate=5e-2, precision="bfloat16")
    model = wrap(load_model(base_dir, torch.bfloat16), LoraSettings(rank=4, alpha=8))
    trainer = Trainer(model, config, device="cpu")
    masters = dict(trainer.model.named_parameters())
    copies = dict(trainer.compute.named_parameters())
    adapter = {n for n, p in masters.items() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    for name, master in masters.items():
        assert master.dtype == (torch.float32 if name in adapter else torch.bfloat16), name
        assert copies[name].dtype == torch.bfloat16, name
        # the frozen base is one tensor, shared by the masters' model and the compute copy
        assert (copies[name].data_ptr() == master.data_ptr()) == (name not in adapter), name
    # the optimizer holds the float32 adapter alone
    assert {p.dtype for p in trainer.parameters} == {torch.float32}
    exact = Trainer(wrap(load_model(base_dir), LoraSettings(rank=4, alpha=8)), TrainerConfig())
    before = trainer.logprobs_of(PROMPT, COMPLETION)
    assert before == pytest.approx(exact.logprobs_of(PROMPT, COMPLETION), abs=0.05)

    for _ in range(2):
        metrics = trainer.step([rewarded(trainer)], [1.0])
        assert metrics["trained_tokens"] == len(COMPLETION) and metrics["grad_norm"] > 0
    assert sum(trainer.logprobs_of(PROMPT, COMPLETION)) > sum(before)
    for name in adapter:  # the copy is the moved masters, rounded
        assert torch.equal(copies[name], masters[name].detach().to(torch.bfloat16)), name

    # the adapter vLLM loads is that bf16 copy; the float32 masters go in the training state
    out = save_adapter(trainer.served_model, tmp_path / "step", base_dir=base_dir)  # type: ignore[arg-type]
    assert {t.dtype for t in load_file(str(out / ADAPTER_WEIGHTS)).values()} == {torch.bfloat16}
    torch.save(trainer.training_state(), tmp_path / "state.pt")  # as the learner keeps it
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert set(state["master"]) == adapter
    assert {t.dtype for t in state["master"].values()} == {torch.float32}
    resumed = Trainer(load_trainable(out, torch.bfloat16), config, device="cpu")
    assert resumed.logprobs_of(PROMPT, COMPLETION) == trainer.logprobs_of(PROMPT, COMPLETION)
    resumed.load_training_state(state)
    for name in adapter:
        assert torch.equal(dict(resumed.model.named_parameters())[name], masters[name]), name
    trainer.step([rewarded(trainer)], [1.0])
    resumed.step([rewarded(resumed)], [1.0])
    for name in adapter:
        assert torch.equal(dict(resumed.model.named_parameters())[name], masters[name]), name
