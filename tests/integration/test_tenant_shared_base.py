"""`learn --lora --tenants` on one frozen base (learner/adapter_bank.py): one tenant among
several saved, rolled back and restored through the learner's own parts (Weights,
Publishing, Stepping) against a real store, on the tiny model, without vLLM (the publish
itself is tests/e2e/test_lora_vllm.py's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from sqlalchemy import Engine

from learner.adapter_trainer import AdapterTrainer
from learner.config import LearnerConfig
from learner.loop import Learner
from learner.loop.state import Lineage
from learner.lora import load_trainable
from learner.trainer import Trainer
from store import policy_versions
from store.samples import Sample

PROMPT = [1, 10, 20, 30]
TENANTS = ("a", "b", "c")


def _learner(db_url: str, model: Path, checkpoints: Path) -> Learner:
    config = LearnerConfig(
        database_url=db_url,
        model=str(model),
        graders=["feedback"],
        checkpoints=str(checkpoints),
        lora=True,
        tenants=True,
        lora_rank=4,
        lora_alpha=8,
        learning_rate=1e-2,
    )
    learner = Learner(config)
    # bf16 as against a bf16 vLLM: float32 masters beside each adapter's bf16 copy
    learner.state.trainer_config = dataclasses.replace(
        learner.state.trainer_config, precision="bfloat16"
    )
    return learner


def _lineages(learner: Learner) -> dict[str, Lineage]:
    """Each tenant's lineage with its trainer on what serves it (as learner/loop/tenants.py
    starts a tenant): its own serving version, else the shared policy's."""
    state, out = learner.state, {}
    with state.engine.connect() as conn:
        state.shared.serving = policy_versions.serving_version(conn)
        for tenant in TENANTS:
            own = policy_versions.serving_version(conn, tenant)
            out[tenant] = Lineage.fresh_for(state.config, tenant, own or state.shared.serving)
    for lineage in out.values():
        assert lineage.serving is not None
        with learner.tenants.as_lineage(lineage):
            learner.weights.load(Path(lineage.serving["checkpoint_path"]))
    return out


def _step(trainer: Trainer, completion: list[int]) -> None:
    sample = Sample(
        trajectory_id="t",
        token_ids=PROMPT + completion,
        loss_mask=[False] * len(PROMPT) + [True] * len(completion),
        logprobs=[0.0] * len(PROMPT) + trainer.logprobs_of(PROMPT, completion),
    )
    assert trainer.step([sample], [1.0])["trained_tokens"] == len(completion)


def _publish(learner: Learner, lineage: Lineage, version: str, ordinal: int) -> Path:
    """The lineage's trainer saved as a version of the tenant's, with its optimizer state,
    and recorded serving (the verified publish's record)."""
    state = learner.state
    assert lineage.serving is not None
    with learner.tenants.as_lineage(lineage):
        path = learner.publishing.save(state.checkpoints / version)
        learner.weights.save_optimizer(path)
    with state.engine.begin() as conn:
        policy_versions.add_version(
            conn,
            version=version,
            ordinal=ordinal,
            parent=lineage.serving["version"],
            checkpoint_path=str(path),
            status="serving",
            tenant=lineage.tenant,
        )
        lineage.serving = policy_versions.serving_version(conn, lineage.tenant)
    return path


def _state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The trainer's weights (masters and the copy it computes with) and AdamW moments."""
    assert isinstance(trainer, AdapterTrainer)
    out = {f"master:{n}": p.detach().clone() for n, p in trainer.model.named_parameters()}
    out.update(
        {f"copy:{i}": p.detach().clone() for i, p in enumerate(trainer.bank.slots[trainer.slot])}
    )
    moments = trainer.training_state()["optimizer"]["state"]
    for name, moment in moments.items():
        out[f"exp_avg:{name}"] = moment["exp_avg"].clone()
    return out


def _equal(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_one_tenant_saved_rolled_back_and_restored_among_several_on_one_base(
    db_url: str, engine: Engine, tiny_model: Path, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="base", ordinal=0, parent=None,
            checkpoint_path=str(tiny_model), status="serving",
        )  # fmt: skip
    learner = _learner(db_url, tiny_model, checkpoints)
    lineages = _lineages(learner)
    trainers = {t: lineage.trainer for t, lineage in lineages.items()}
    assert all(isinstance(t, AdapterTrainer) for t in trainers.values())
    (bank,) = learner.weights.banks.banks.values()  # one model, one base, three adapters
    assert len(bank.slots) == 3

    for tenant, completion in zip(TENANTS, ([40, 50], [41, 51], [42, 52]), strict=True):
        _step(trainers[tenant], completion)  # each tenant trained a step, b its first
    b = lineages["b"]
    first = _publish(learner, b, "b-step-1", 1)
    at_first = _state(trainers["b"])
    # what vLLM is to load and verify: the adapter's files answer as the trainer does
    alone = Trainer(load_trainable(first, torch.bfloat16), learner.state.trainer_config, "cpu")
    assert alone.logprobs_of(PROMPT, [41, 51]) == trainers["b"].logprobs_of(PROMPT, [41, 51])

    _step(trainers["b"], [43, 53])
    _publish(learner, b, "b-step-2", 2)
    others = {t: _state(trainers[t]) for t in ("a", "c")}
    assert not _equal(_state(trainers["b"]), at_first)

    # roll b back to its first version (an operator's rollback, as the learner follows it)
    with engine.begin() as conn:
        policy_versions.set_version_status(conn, version="b-step-1", status="serving")
    with learner.tenants.as_lineage(b):
        learner.stepping.follow_operator()
    assert b.serving is not None and b.serving["version"] == "b-step-1"
    assert b.trainer is not trainers["b"] and _equal(_state(b.trainer), at_first)
    assert all(_equal(_state(trainers[t]), others[t]) for t in ("a", "c"))  # untouched
    assert len(bank.slots) == 3  # b's old adapter left the model with its trainer
    _step(b.trainer, [44, 54])
    continued = _state(b.trainer)

    # a restart restores b from its serving version: the same weights and moments, and its
    # next step the same step
    restarted = _learner(db_url, tiny_model, checkpoints)
    again = _lineages(restarted)
    assert again["b"].serving is not None and again["b"].serving["version"] == "b-step-1"
    assert again["b"].trainer is not None and _equal(_state(again["b"].trainer), at_first)
    assert again["a"].serving is not None and again["a"].serving["version"] == "base"
    _step(again["b"].trainer, [44, 54])
    assert _equal(_state(again["b"].trainer), continued)

    # a deleted tenant's slot is freed; the last frees the base
    for tenant in TENANTS:
        restarted.weights.release(tenant)
    assert not restarted.weights.banks.banks
