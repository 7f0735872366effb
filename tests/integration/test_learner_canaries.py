"""The learner's own canaries (learner/canary/starts.py, learner/loop/publish.py, step.py), on
SQLite and PostgreSQL, on the tiny model's trainer, publishing into a fake replica that
loads adapters and answers the probe (FakeReplica, tests/support/fake_vllm.py; what a real
vLLM serves is tests/e2e's):

- with a canary share, a tenant's new version is loaded beside what serves and started as
  the learner's canary; the tenant's pointer does not move, and the tenant trains no step
  while the canary runs; a promotion moves the pointer and the trainer goes on from the
  candidate, a rollback leaves the pointer and the trainer goes back to what serves, which
  stays loaded however many candidates were rolled back since;
- a tenant's own settings start its canaries where the learner's share is 0, and a tenant
  without them is served at once;
- the shared policy's canary (--lora) is promoted by the learner with a swap of the replica;
- full weights cannot serve beside the incumbent: served at once, said once."""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from learner.adapter_trainer import AdapterTrainer
from learner.config import LearnerConfig
from learner.loop import Learner
from learner.loop import publish as publish_module
from learner.loop.state import Lineage
from learner.loop.tenants import TenantTurn
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import Probe, PublishResult
from learner.swap.versions import serve_version
from learner.trainer import Trainer
from store import canaries, policy_versions, tenants
from store.canaries import CanaryRow
from store.samples import Sample
from tests.support.canary_traffic import serve
from tests.support.fake_vllm import VERSION, FakeReplica

PROMPT = [1, 10, 20, 30]


@pytest.fixture
def replica() -> Any:
    with FakeReplica() as fake:
        yield fake


def _learner(
    db_url: str,
    engine: Engine,
    tiny_model: Path,
    tmp_path: Path,
    replica: FakeReplica,
    *more: FakeReplica,
    **extra: Any,
) -> Learner:
    with engine.begin() as conn:
        policy_versions.add_version(
            conn, version="base", ordinal=0, parent=None,
            checkpoint_path=str(tiny_model), status="serving",
        )  # fmt: skip
    settings: dict[str, Any] = {"lora": True, "lora_rank": 4, "lora_alpha": 8, **extra}
    config = LearnerConfig(
        database_url=db_url,
        model=str(tiny_model),
        graders=["feedback"],
        checkpoints=str(tmp_path / "ckpt"),
        upstreams=[replica.url, *(r.url for r in more)],
        learning_rate=1e-2,
        **settings,
    )
    learner = Learner(config)
    state = learner.state
    # what start-up reads from the replicas: the fake holds no model, so any probe passes
    state.probe = Probe(prompt_token_ids=PROMPT)
    state.tolerance = 1e9
    state.trainer_config = dataclasses.replace(state.trainer_config, precision="float32")
    with engine.connect() as conn:
        state.shared.serving = policy_versions.serving_version(conn)
    return learner


def _lineage(learner: Learner, tenant: str | None) -> Lineage:
    """The lineage's trainer and publisher on what serves it (the shared policy's base), as
    start-up and a tenant's first turn make them."""
    state = learner.state
    lineage = state.shared if tenant is None else Lineage.fresh_for(state.config, tenant)
    lineage.serving = state.shared.serving
    assert lineage.serving is not None
    source = Path(lineage.serving["checkpoint_path"])
    with learner.tenants.as_lineage(lineage):
        learner.weights.load(source)
        lineage.publisher = learner.publishing.publisher_for(source)
    if tenant is not None:
        learner.tenants.turns[tenant] = TenantTurn(lineage)
    return lineage


def _tenant(engine: Engine, name: str, **canary: Any) -> None:
    with engine.begin() as conn:
        now = datetime.now(UTC)
        tenants.put_tenant(conn, name=name, client_keys=[], interaction_types=[name], now=now)
        if canary:
            tenants.set_canary(conn, name=name, overrides=canary, now=now)  # type: ignore[arg-type]


def _step(trainer: Trainer | None, completion: list[int]) -> None:
    assert trainer is not None
    sample = Sample(
        trajectory_id="t",
        token_ids=PROMPT + completion,
        loss_mask=[False] * len(PROMPT) + [True] * len(completion),
        logprobs=[0.0] * len(PROMPT) + trainer.logprobs_of(PROMPT, completion),
    )
    assert trainer.step([sample], [1.0])["trained_tokens"] == len(completion)


def _publish(learner: Learner, lineage: Lineage, step: int) -> PublishResult:
    with learner.tenants.as_lineage(lineage):
        result = learner.publishing.publish_step(step, {}, [], lineage.baselines)
    assert result is not None and result.ok, result
    return result


def _state(trainer: Trainer | None) -> dict[str, torch.Tensor]:
    """An adapter trainer's masters and AdamW moments."""
    assert isinstance(trainer, AdapterTrainer)
    out = {f"master:{n}": p.detach().clone() for n, p in trainer.model.named_parameters()}
    for name, moment in trainer.training_state()["optimizer"]["state"].items():
        out[f"exp_avg:{name}"] = moment["exp_avg"].clone()
    return out


def _equal(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def _canaries(engine: Engine) -> list[CanaryRow]:
    with engine.connect() as conn:
        return list(reversed(canaries.list_canaries(conn)))


def _pointer(engine: Engine, tenant: str) -> str | None:
    with engine.connect() as conn:
        found = tenants.get_tenant(conn, tenant)
    assert found is not None
    return found["serving_version"]


def _status(engine: Engine, version: str) -> str:
    with engine.connect() as conn:
        found = policy_versions.version(conn, version=version)
    assert found is not None
    return found["status"]


def _decide(engine: Engine, action: str, canary_id: int) -> None:
    """An operator's decision (the learner's own are learner/loop/canaries.py's)."""
    act = canaries.promote if action == "promote" else canaries.roll_back
    with engine.begin() as conn:
        act(conn, canary_id=canary_id, by="admin", reason="", now=datetime.now(UTC))


def test_a_tenant_s_new_version_serves_a_canary_and_only_its_promotion_moves_the_pointer(
    db_url: str, engine: Engine, tiny_model: Path, tmp_path: Path, replica: FakeReplica
) -> None:
    learner = _learner(
        db_url, engine, tiny_model, tmp_path, replica, tenants=True,
        canary_share=0.2, canary_min_calls=30, max_staleness=0,
    )  # fmt: skip
    _tenant(engine, "support")
    lineage = _lineage(learner, "support")
    _step(lineage.trainer, [40, 50])
    trained = _state(lineage.trainer)

    first = _publish(learner, lineage, 1).version
    (canary,) = _canaries(engine)
    assert (canary["tenant"], canary["candidate"], canary["incumbent"]) == (
        "support",
        first,
        "base",
    )
    assert (canary["share"], canary["min_calls"], canary["default_decision"]) == (
        0.2, 30, "rollback",
    )  # fmt: skip
    assert (canary["status"], canary["started_by"]) == ("running", "learner")
    (start,) = canary["actions"]
    assert start["by"] == "learner" and "step 1's version, verified" in start["reason"]
    assert start["detail"] is not None and start["detail"]["step"] == 1
    # loaded beside what serves, verified and recorded, serving nobody by the pointer
    assert first in replica.adapters and replica.version == VERSION
    assert _pointer(engine, "support") is None  # the shared policy still answers the tenant
    assert _status(engine, first) == policy_versions.CANARY
    assert lineage.serving is not None and lineage.serving["version"] == "base"
    assert lineage.canary == canary["id"]

    # no step of the tenant while its canary runs
    assert not learner.tenants.train()
    assert learner.state.activity == f"no step of tenant support while canary {canary['id']} runs"

    _decide(engine, "promote", canary["id"])
    assert _pointer(engine, "support") == first and _status(engine, first) == "serving"
    assert not learner.tenants.train()  # nothing graded to train on, but it follows
    assert lineage.serving["version"] == first and lineage.canary is None
    assert _equal(_state(lineage.trainer), trained)  # on from the step, its moments too

    # the next version's canary is rolled back: the pointer stays, the trainer goes back
    _step(lineage.trainer, [41, 51])
    second = _publish(learner, lineage, 2).version
    canary = _canaries(engine)[-1]
    assert (canary["candidate"], canary["incumbent"]) == (second, first)
    _decide(engine, "rollback", canary["id"])
    assert _pointer(engine, "support") == first
    assert _status(engine, second) == "rolled_back"
    learner.tenants.train()
    assert lineage.serving["version"] == first and lineage.canary is None
    assert _equal(_state(lineage.trainer), trained)
    with engine.connect() as conn:
        assert policy_versions.serving_name(conn, "support") == first

    # canaries rolled back are newer than what serves: it stays loaded all the same (two
    # adapters of the lineage are kept, at --max-staleness 0)
    _step(lineage.trainer, [42, 52])
    third = _publish(learner, lineage, 3).version
    _decide(engine, "rollback", _canaries(engine)[-1]["id"])
    learner.tenants.train()
    _step(lineage.trainer, [43, 53])
    fourth = _publish(learner, lineage, 4).version
    assert first in replica.adapters and fourth in replica.adapters
    assert second not in replica.adapters and third not in replica.adapters


def test_a_tenant_s_own_settings_start_its_canaries_and_another_is_served_at_once(
    db_url: str, engine: Engine, tiny_model: Path, tmp_path: Path, replica: FakeReplica
) -> None:
    learner = _learner(db_url, engine, tiny_model, tmp_path, replica, tenants=True)
    _tenant(engine, "support", share=0.5, min_calls=7, default_decision="promote")
    _tenant(engine, "sales", watch={"min_trajectories": 5})  # the watch's alone: no share
    for step, name in enumerate(("support", "sales"), start=1):
        lineage = _lineage(learner, name)
        _step(lineage.trainer, [40 + step, 50])
        _publish(learner, lineage, step)

    (canary,) = _canaries(engine)
    assert canary["tenant"] == "support"
    assert (canary["share"], canary["min_calls"], canary["default_decision"]) == (
        0.5, 7, "promote",
    )  # fmt: skip
    assert canary["actions"][0]["detail"] == {
        "step": 1,
        "settings": "tenant support's share, min_calls, default_decision, else the learner's",
        "ends_at": canary["actions"][0]["detail"]["ends_at"],  # type: ignore[index]
    }
    assert _pointer(engine, "support") is None
    served = _pointer(engine, "sales")
    assert served is not None and served.startswith("sales-step-2-")
    assert _status(engine, served) == "serving"


def test_the_shared_policy_s_canary_is_promoted_by_the_learner_s_swap(
    db_url: str, engine: Engine, tiny_model: Path, tmp_path: Path, replica: FakeReplica
) -> None:
    learner = _learner(
        db_url, engine, tiny_model, tmp_path, replica, canary_share=0.3, canary_min_calls=30
    )
    lineage = _lineage(learner, None)
    _step(lineage.trainer, [40, 50])
    candidate = _publish(learner, lineage, 1).version
    (canary,) = _canaries(engine)
    assert (canary["tenant"], canary["candidate"], canary["incumbent"]) == (None, candidate, "base")
    assert replica.version == VERSION and candidate in replica.adapters
    with engine.connect() as conn:
        assert policy_versions.serving_name(conn) == "base"

    # the candidate's arm is better on reward, nothing worse: the learner promotes it
    serve(engine, None, candidate, [1.0, 1.0, 0.0, 1.0] * 15, at=time.time(), spacing=0)
    serve(engine, None, "base", [0.0, 0.0, 1.0, 0.0] * 15, at=time.time(), spacing=0)
    assert learner.canaries.decide_running() == 1

    (canary,) = _canaries(engine)
    assert (canary["status"], canary["decided_by"]) == ("promoted", "learner")
    with engine.connect() as conn:
        serving = policy_versions.serving_version(conn)
    assert serving is not None and serving["version"].startswith(f"{candidate}+rollback-")
    assert serving["checkpoint_path"] == str(tmp_path / "ckpt" / candidate)
    assert replica.version == serving["version"]  # every replica labelled with it
    assert _status(engine, candidate) == "superseded"
    learner.stepping.maybe_train()
    assert lineage.serving is not None and lineage.serving["version"] == serving["version"]
    assert lineage.canary is None


def test_full_weights_are_served_at_once_and_the_learner_says_so_once(
    db_url: str,
    engine: Engine,
    tiny_model: Path,
    tmp_path: Path,
    replica: FakeReplica,
    caplog: pytest.LogCaptureFixture,
) -> None:
    learner = _learner(db_url, engine, tiny_model, tmp_path, replica, lora=False, canary_share=0.2)
    lineage = _lineage(learner, None)
    _step(lineage.trainer, [40, 50])
    with caplog.at_level(logging.WARNING, logger="onthejob.learner"):
        version = _publish(learner, lineage, 1).version
        assert learner.publishing.canary_starts.settings_for(None, adapter=False) is None
    assert not _canaries(engine)
    assert _status(engine, version) == "serving" and replica.version == version
    said = [r.getMessage() for r in caplog.records if "canary" in r.getMessage()]
    assert said == [
        "canary: the shared policy's versions serve all of its traffic at once, not 0.2 of it "
        "as a canary: a canary's candidate serves beside the incumbent as an adapter (--lora), "
        "or as full weights on some of two or more replicas (this learner has 1)"
    ]


@pytest.fixture
def second() -> Any:
    with FakeReplica() as fake:
        yield fake


@dataclasses.dataclass
class FullWeightCanary:
    """A learner of full weights on two replicas, its first version published as a
    canary: the version, its canary, and the trainer's weights before the step."""

    learner: Learner
    lineage: Lineage
    candidate: str
    canary: CanaryRow
    before: dict[str, torch.Tensor]


@pytest.fixture
def full(
    db_url: str,
    engine: Engine,
    tiny_model: Path,
    tmp_path: Path,
    replica: FakeReplica,
    second: FakeReplica,
) -> FullWeightCanary:
    learner = _learner(
        db_url, engine, tiny_model, tmp_path, replica, second, lora=False, canary_share=0.5,
        canary_min_calls=30,
    )  # fmt: skip
    lineage = _lineage(learner, None)
    assert lineage.trainer is not None
    before = {n: p.detach().clone() for n, p in lineage.trainer.model.named_parameters()}
    _step(lineage.trainer, [40, 50])
    candidate = _publish(learner, lineage, 1).version
    (canary,) = _canaries(engine)
    return FullWeightCanary(learner, lineage, candidate, canary, before)


def test_full_weights_serve_a_canary_on_some_replicas_until_the_learner_promotes_them(
    full: FullWeightCanary,
    engine: Engine,
    tmp_path: Path,
    replica: FakeReplica,
    second: FakeReplica,
) -> None:
    learner, lineage, candidate, canary = full.learner, full.lineage, full.candidate, full.canary
    assert (canary["tenant"], canary["candidate"], canary["incumbent"]) == (None, candidate, "base")
    assert (canary["status"], canary["started_by"]) == ("running", "learner")
    # the candidate serves on the second replica alone; the first serves on as it was
    checkpoint = str((tmp_path / "ckpt" / candidate).resolve())
    assert (second.version, second.reloads) == (candidate, [checkpoint])
    assert (replica.version, replica.reloads) == (VERSION, [])
    assert _status(engine, candidate) == policy_versions.CANARY
    with engine.connect() as conn:
        assert policy_versions.serving_name(conn) == "base"
    assert lineage.serving is not None and lineage.serving["version"] == "base"

    serve(engine, None, candidate, [1.0, 1.0, 0.0, 1.0] * 15, at=time.time(), spacing=0)
    serve(engine, None, "base", [0.0, 0.0, 1.0, 0.0] * 15, at=time.time(), spacing=0)
    assert learner.canaries.decide_running() == 1
    with engine.connect() as conn:
        serving = policy_versions.serving_version(conn)
    assert serving is not None and serving["version"].startswith(f"{candidate}+rollback-")
    assert replica.version == second.version == serving["version"]
    assert replica.reloads == [checkpoint]
    learner.stepping.maybe_train()
    assert lineage.serving is not None and lineage.serving["version"] == serving["version"]
    assert lineage.canary is None
    publisher = lineage.publisher
    assert isinstance(publisher, FullWeightPublisher)
    assert (publisher.canary_replicas, publisher.last_good) == ([], Path(checkpoint))


def test_a_rolled_back_full_weight_candidate_s_replicas_serve_what_the_others_do_again(
    full: FullWeightCanary,
    engine: Engine,
    tiny_model: Path,
    replica: FakeReplica,
    second: FakeReplica,
) -> None:
    learner, lineage, candidate, canary = full.learner, full.lineage, full.candidate, full.canary
    _decide(engine, "roll_back", canary["id"])
    learner.stepping.maybe_train()
    # the second replica serves the base again, under the name the first serves it by
    assert second.version == "base" and second.reloads[-1] == str(tiny_model.resolve())
    assert (replica.version, replica.reloads) == (VERSION, [])
    assert _status(engine, candidate) == "rolled_back"
    with engine.connect() as conn:
        assert policy_versions.serving_name(conn) == "base"
    publisher = lineage.publisher
    assert isinstance(publisher, FullWeightPublisher) and publisher.canary_replicas == []
    assert lineage.canary is None and not lineage.needs_restore
    assert lineage.trainer is not None  # and it trains from the base again
    assert all(torch.equal(p, full.before[n]) for n, p in lineage.trainer.model.named_parameters())


def test_a_restore_of_every_replica_rolls_back_the_full_weight_canary_it_overwrote(
    full: FullWeightCanary,
    engine: Engine,
    replica: FakeReplica,
    second: FakeReplica,
) -> None:
    learner = full.learner
    lineage = full.lineage
    canary = full.canary
    lineage.needs_restore = True  # as after a swap whose replicas were left fenced off
    learner.startup.restore()
    assert replica.version == second.version == "base"
    (canary,) = _canaries(engine)
    assert (canary["status"], canary["decided_by"]) == ("rolled_back", "learner")
    assert "no longer serves on any replica" in (canary["reason"] or "")
    learner.stepping.maybe_train()  # the learner follows: no canary holds its steps
    assert lineage.canary is None


def test_a_failed_promotion_leaves_each_replica_named_for_the_weights_it_holds(
    full: FullWeightCanary,
    engine: Engine,
    tiny_model: Path,
    replica: FakeReplica,
    second: FakeReplica,
) -> None:
    """The promotion's swap fails on the candidate's replica: it gets the incumbent's
    weights back, and their name with them (not the candidate's it served them under)."""
    learner = full.learner
    candidate = full.candidate
    serve(engine, None, candidate, [1.0, 1.0, 0.0, 1.0] * 15, at=time.time(), spacing=0)
    serve(engine, None, "base", [0.0, 0.0, 1.0, 0.0] * 15, at=time.time(), spacing=0)
    second.refuse_reloads = 4  # every try of the candidate's reload there
    assert learner.canaries.decide_running() == 0  # left to an operator
    base = str(tiny_model.resolve())
    assert replica.reloads[-1] == second.reloads[-1] == base
    assert replica.version == second.version == "base"
    (canary,) = _canaries(engine)
    assert canary["status"] == "running"
    with engine.connect() as conn:
        assert policy_versions.serving_name(conn) == "base"


def test_a_rollback_by_hand_ends_the_canary_it_would_otherwise_undo(
    full: FullWeightCanary,
    engine: Engine,
    tiny_model: Path,
    replica: FakeReplica,
    second: FakeReplica,
) -> None:
    learner = full.learner
    lineage = full.lineage
    candidate = full.candidate
    with engine.begin() as conn:  # a version from before the one serving, to roll back to
        probe = (policy_versions.version(conn, version=candidate) or {}).get("probe")
        policy_versions.add_version(
            conn, version="older", ordinal=-1, parent=None, checkpoint_path=str(tiny_model),
            status="superseded", probe=probe,
        )  # fmt: skip
    served = serve_version(engine, [replica.url, second.url], "older", action="rollback")
    (canary,) = _canaries(engine)
    assert (canary["status"], canary["decided_by"]) == ("rolled_back", "rollback")
    assert "older was served by a rollback" in (canary["reason"] or "")
    assert replica.version == second.version == served
    learner.stepping.maybe_train()  # follows the rollback; nothing left to withdraw
    publisher = lineage.publisher
    assert isinstance(publisher, FullWeightPublisher)
    assert publisher.canary_replicas == [] and second.version == served
    assert lineage.serving is not None and lineage.serving["version"] == served


def test_a_withdrawal_cut_short_by_the_store_is_done_at_the_next_look(
    full: FullWeightCanary,
    engine: Engine,
    tiny_model: Path,
    second: FakeReplica,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    learner = full.learner
    lineage = full.lineage
    canary = full.canary
    _decide(engine, "roll_back", canary["id"])
    held = publish_module.lease.held

    def store_gone(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("SELECT 1", {}, Exception("the store went away"))

    monkeypatch.setattr(publish_module.lease, "held", store_gone)
    with pytest.raises(OperationalError):
        learner.stepping.maybe_train()
    assert lineage.canary is None and second.version != "base"  # decided, not withdrawn
    monkeypatch.setattr(publish_module.lease, "held", held)
    learner.stepping.maybe_train()
    assert second.version == "base" and second.reloads[-1] == str(tiny_model.resolve())
    publisher = lineage.publisher
    assert isinstance(publisher, FullWeightPublisher) and publisher.canary_replicas == []
