"""Tenants' adapters on one frozen base (learner/adapter_bank.py, adapter_trainer.py), on
the tiny model: they train independently, and save, load and publish as adapters of their own
models do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from learner.adapter_bank import AdapterBanks
from learner.adapter_trainer import AdapterTrainer
from learner.checkpoint import load_model
from learner.lora import LoraSettings, adapter_tensors, load_trainable, save_adapter, wrap
from learner.tiny_model import build_tiny_model
from learner.trainer import Trainer, TrainerConfig
from store.samples import Sample

PROMPT, COMPLETION = [1, 10, 20, 30], [40, 50, 60]
SETTINGS = LoraSettings(rank=4, alpha=8)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def sample(trainer: Trainer, completion: list[int] = COMPLETION) -> Sample:
    return Sample(
        trajectory_id="t",
        token_ids=PROMPT + completion,
        loss_mask=[False] * len(PROMPT) + [True] * len(completion),
        logprobs=[0.0] * len(PROMPT) + trainer.logprobs_of(PROMPT, completion),
    )


def step(trainer: Trainer, completion: list[int] = COMPLETION) -> None:
    metrics = trainer.step([sample(trainer, completion)], [1.0])
    assert metrics["trained_tokens"] == len(completion)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def same(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    now = dict(module.named_parameters())
    return before.keys() == now.keys() and all(torch.equal(before[n], now[n]) for n in before)


@pytest.fixture(scope="module")
def adapter_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter whose B is not zero (a trained one's), seeded."""
    torch.manual_seed(7)
    model = wrap(load_model(tiny_model), SETTINGS)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return save_adapter(model, tmp_path_factory.mktemp("adapters") / "a", base_dir=tiny_model)


def tenant(
    banks: AdapterBanks, owner: str, source: Path, precision: str, lr: float = 1e-2
) -> AdapterTrainer:
    bank, slot = banks.take(owner, source, SETTINGS, DTYPES[precision], "cpu")
    config = TrainerConfig(precision=precision, learning_rate=lr)
    return AdapterTrainer(bank, slot, config, "cpu")


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_tenant_s_step_leaves_the_other_adapter_and_the_base_as_they_were(
    tiny_model: Path, adapter_dir: Path, precision: str
) -> None:
    banks = AdapterBanks()
    a = tenant(banks, "a", adapter_dir, precision)
    b = tenant(banks, "b", tiny_model, precision)  # a fresh adapter beside a loaded one
    assert a.compute is b.compute and len(banks.banks) == 1  # one model, one base
    bank = a.bank
    assert bank.model is not None
    own = {id(p) for slot in bank.slots.values() for p in slot}
    base = {n: p.detach().clone() for n, p in bank.model.named_parameters() if id(p) not in own}
    b_masters, b_copy = snapshot(b.model), [p.detach().clone() for p in bank.slots[b.slot]]
    a_masters = snapshot(a.model)
    b_answers = b.logprobs_of(PROMPT, COMPLETION)

    step(a)

    assert not same(a_masters, a.model)  # A moved
    assert same(b_masters, b.model)  # B's masters, its copy and its answers: bit-identical
    assert all(torch.equal(x, p) for x, p in zip(b_copy, bank.slots[b.slot], strict=True))
    assert b.logprobs_of(PROMPT, COMPLETION) == b_answers
    assert all(p.grad is None for p in bank.slots[b.slot]) and not b.optimizer.state
    now = dict(bank.model.named_parameters())
    assert all(torch.equal(tensor, now[name]) for name, tensor in base.items())  # base frozen
    assert all(not now[name].requires_grad for name in base)


def test_optimizer_states_stay_apart(tiny_model: Path, adapter_dir: Path) -> None:
    banks = AdapterBanks()
    a, b = tenant(banks, "a", adapter_dir, "bfloat16"), tenant(banks, "b", adapter_dir, "bfloat16")
    step(a)
    step(b, [41, 51, 61])
    held = [{id(p) for group in t.optimizer.param_groups for p in group["params"]} for t in (a, b)]
    assert held[0] == {id(p) for p in a.parameters} and held[1] == {id(p) for p in b.parameters}
    assert not held[0] & held[1]
    # each is saved under the names an adapter of its own model has, with its own moments
    states = [t.training_state() for t in (a, b)]
    names = [set(s["optimizer"]["state"]) for s in states]
    assert names[0] == names[1] and all(".default." in name for name in names[0])
    some = sorted(names[0])[0]
    moments = [s["optimizer"]["state"][some]["exp_avg"] for s in states]
    assert not torch.equal(moments[0], moments[1])


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_step_after_another_tenant_s_gives_what_a_step_alone_gives(
    adapter_dir: Path, precision: str
) -> None:
    """Bit-identical on the CPU: A's passes run with A's adapter alone active, over the same
    base tensors, whatever ran before them."""
    beside, alone = AdapterBanks(), AdapterBanks()
    a, b = tenant(beside, "a", adapter_dir, precision), tenant(beside, "b", adapter_dir, precision)
    step(b, [41, 51, 61])
    step(a)
    only = tenant(alone, "a", adapter_dir, precision)
    step(only)
    assert same(snapshot(only.model), a.model)
    assert a.logprobs_of(PROMPT, COMPLETION) == only.logprobs_of(PROMPT, COMPLETION)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_slot_trains_saves_and_publishes_as_an_adapter_of_its_own_model(
    tiny_model: Path, adapter_dir: Path, tmp_path: Path, precision: str
) -> None:
    """The same step as a trainer of its own model, the same optimizer state (either loads
    the other's), and the same adapter files (the weights byte for byte): vLLM loads them
    as before."""
    config = TrainerConfig(precision=precision, learning_rate=1e-2)
    own = Trainer(load_trainable(adapter_dir, DTYPES[precision]), config, "cpu")
    banks = AdapterBanks()
    tenant(banks, "other", adapter_dir, precision)  # so the slot is not the bank's first
    slot = tenant(banks, "a", adapter_dir, precision)
    step(own)
    step(slot)
    assert same(_trained(own), slot.model)
    paths = [save_adapter(t.served_model, tmp_path / n, base_dir=tiny_model) for n, t in
             (("own", own), ("slot", slot))]  # fmt: skip
    files = sorted(p.name for p in paths[0].iterdir())
    assert files == sorted(p.name for p in paths[1].iterdir())
    for name in files:
        if name == "adapter_config.json":  # peft keeps target_modules as a set: its order in
            # the file follows the string hashes, any process's own (vLLM reads a set too)
            own_config, slot_config = (json.loads((p / name).read_text()) for p in paths)
            for written in (own_config, slot_config):
                written["target_modules"] = sorted(written["target_modules"])
            assert own_config == slot_config
        else:
            assert (paths[0] / name).read_bytes() == (paths[1] / name).read_bytes(), name
    # optimizer state and masters: saved alike, each loads the other's
    saved = own.training_state(), slot.training_state()
    assert saved[0]["optimizer"]["state"].keys() == saved[1]["optimizer"]["state"].keys()
    fresh = tenant(banks, "b", paths[1], precision)
    fresh.load_training_state(saved[0])
    back = Trainer(load_trainable(paths[1], DTYPES[precision]), config, "cpu")
    back.load_training_state(saved[1])
    step(fresh)
    step(back)
    assert same(_trained(back), fresh.model)


def test_an_adapter_is_written_as_peft_writes_it_from_the_whole_model(
    tiny_model: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    """write_adapter hands peft the slot's tensors alone (peft picking them out of a bank's
    whole state dict cost most of a publish): the files are those peft writes unaided, the
    other tenants' adapters left out."""
    banks = AdapterBanks()
    tenant(banks, "other", adapter_dir, "bfloat16")
    slot = tenant(banks, "a", adapter_dir, "bfloat16")
    step(slot)
    model = slot.served_model
    ours = save_adapter(model, tmp_path / "ours", base_dir=tiny_model)
    name = model.active_adapter
    picked = adapter_tensors(model, name)
    assert picked and all(f".{name}." in key for key in picked)
    unaided = tmp_path / "unaided"
    model.save_pretrained(str(unaided), safe_serialization=True, selected_adapters=[name])
    written = unaided / name if name != "default" else unaided
    weights = "adapter_model.safetensors"
    assert (ours / weights).read_bytes() == (written / weights).read_bytes()
    configs = [json.loads((d / "adapter_config.json").read_text()) for d in (ours, written)]
    for config in configs:
        config["target_modules"] = sorted(config["target_modules"])
    assert configs[0] == configs[1]


def _trained(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_a_slot_taken_again_replaces_the_old_one_and_the_last_frees_the_base(
    tiny_model: Path, adapter_dir: Path, tmp_path: Path
) -> None:
    banks = AdapterBanks()
    first = tenant(banks, "a", adapter_dir, "float32")
    tenant(banks, "b", adapter_dir, "float32")
    again = tenant(banks, "a", tiny_model, "float32")  # rolled back to the base, say
    bank = again.bank
    assert bank is first.bank and set(bank.slots) == {again.slot, banks.owned["b"][1]}
    assert bank.model is not None and first.slot not in bank.model.peft_config
    # a load that fails leaves the tenant's slot as it was
    broken = tmp_path / "broken"
    shutil.copytree(adapter_dir, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not tensors")
    with pytest.raises(Exception):  # noqa: B017 - whatever peft and safetensors raise
        tenant(banks, "a", broken, "float32")
    assert banks.owned["a"] == (bank, again.slot)
    step(again)
    # another base: another bank; the last slot out frees a bank's base
    other = build_tiny_model(tmp_path / "other", seed=1)
    tenant(banks, "c", other, "float32")
    assert len(banks.banks) == 2
    for owner in ("a", "b", "c"):
        banks.release(owner)
    assert not banks.banks and not banks.owned and bank.model is None


def test_the_kl_reference_of_a_slot_is_the_base(tiny_model: Path, adapter_dir: Path) -> None:
    banks = AdapterBanks()
    bank, slot = banks.take("a", adapter_dir, SETTINGS, torch.float32, "cpu")
    config = TrainerConfig(learning_rate=1e-2)
    trainer = AdapterTrainer(bank, slot, config, "cpu")
    plain = Trainer(load_model(tiny_model), config, "cpu")
    with trainer.compute.disable_adapter():
        assert trainer.logprobs_of(PROMPT, COMPLETION) == plain.logprobs_of(PROMPT, COMPLETION)
    assert trainer.logprobs_of(PROMPT, COMPLETION) != plain.logprobs_of(PROMPT, COMPLETION)
