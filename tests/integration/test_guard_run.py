"""The guard's bookkeeping on both databases (learner/guard_run.py, store/guard_records.py):
baselines kept per checkpoint, the waiver consumed by the next version, an operator's
protected pin applied, every decision recorded. The evals themselves are replaced by fixed
scores here; tests/e2e/test_guard_vllm.py runs real ones."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from learner.guard import GuardConfig, GuardedType, Score
from learner.guard_run import Guard
from learner.rollout.taskset import TaskSet
from store import learner_state
from store.guard_records import CONFIG, PROTECTED, WAIVER, decisions
from store.tasks import TaskTable


class FixedScores(Guard):
    """A guard whose evals answer from a table: {version: {type: Score}}."""

    def __init__(
        self, engine: Engine, table: dict[str, dict[str, Score]], tenant: str | None = None
    ) -> None:
        types = [GuardedType(n, TaskSet(f"guard:{n}", TaskTable({})), ["true"]) for n in "ab"]
        config = GuardConfig("http://127.0.0.1:1", types)
        super().__init__(config, engine, "unused", tenant=tenant)
        self.table = table
        self.evaluated: list[str] = []

    def score(self, guarded: GuardedType, version: str) -> Score | None:
        self.evaluated.append(f"{version}/{guarded.name}")
        return self.table[version].get(guarded.name)


def version(name: str, checkpoint: str) -> dict[str, Any]:
    return {"version": name, "checkpoint_path": checkpoint}


def test_decisions_baselines_waiver_and_pins(engine: Engine) -> None:
    good, bad = Score(0.8, 400), Score(0.4, 400)
    guard = FixedScores(
        engine,
        {
            "v0": {"a": good, "b": good},
            "v1": {"a": Score(0.9, 400), "b": bad},  # a up, b down
            "v2": {"a": Score(0.9, 400), "b": bad},
            "v3": {"a": bad, "b": good},
        },
    )
    v0, v0_again = version("v0", "/ck/v0"), version("v0+rollback-2", "/ck/v0")
    assert guard.check(version("v1", "/ck/v1"), v0, step=1).outcome == "rolled_back"
    assert guard.evaluated == ["v0/a", "v0/b", "v1/a", "v1/b"]
    # after the rollback, the same weights under their new label: not evaluated again
    guard.evaluated.clear()
    with engine.begin() as conn:
        learner_state.set_state(conn, WAIVER, {"types": None, "reason": "wanted"})
    assert guard.check(version("v2", "/ck/v2"), v0_again, step=2).outcome == "waived"
    assert guard.evaluated == ["v2/a", "v2/b"]
    with engine.connect() as conn:
        assert learner_state.get_state(conn, WAIVER) is None  # for that version only
    # pinned protected by an operator: a waiver naming no types no longer covers "a"
    with engine.begin() as conn:
        learner_state.set_state(conn, PROTECTED, {"a": True})
        learner_state.set_state(conn, WAIVER, {"types": None, "reason": ""})
    assert guard.check(version("v3", "/ck/v3"), v0_again, step=3).outcome == "rolled_back"

    with engine.connect() as conn:
        recorded = decisions(conn)
    assert [(d["version"], d["kept"], d["step"], d["outcome"]) for d in recorded] == [
        ("v1", "v0", 1, "rolled_back"),
        ("v2", "v0+rollback-2", 2, "waived"),
        ("v3", "v0+rollback-2", 3, "rolled_back"),
    ]
    first = {t["type"]: t for t in recorded[0]["types"]}
    assert first["b"]["before"] == {"value": 0.8, "runs": 400}
    assert first["b"]["after"] == {"value": 0.4, "runs": 400}
    assert first["b"]["regressed"] and not first["a"]["regressed"]
    assert recorded[1]["waiver"] == {"types": None, "reason": "wanted"}
    assert {t["type"]: t["protected"] for t in recorded[2]["types"]} == {"a": True, "b": False}
    assert recorded[0]["trained_types"] == []  # no step of that number trained anything


def test_a_tenants_guard_keeps_its_scores_and_decisions_apart(engine: Engine) -> None:
    """learn --tenants: a tenant's evals of the same weights (its first version's parent is
    the shared policy's) are its own, run as the tenant; its decisions name it, and it leaves
    the guard's configuration, which the shared one publishes, as it is."""
    good, bad = Score(0.8, 400), Score(0.4, 400)
    shared = FixedScores(engine, {"v0": {"a": good, "b": good}})
    shared.baseline(version("v0", "/ck/v0"))
    with engine.connect() as conn:
        published = learner_state.get_state(conn, CONFIG)
    upper = FixedScores(
        engine,
        {"v0": {"a": bad, "b": good}, "upper-1": {"a": bad, "b": bad}},
        tenant="upper",
    )
    assert upper.known(version("v0", "/ck/v0")) is None  # the shared guard's are not its own
    decision = upper.check(version("upper-1", "/ck/upper-1"), version("v0", "/ck/v0"), step=1)
    assert decision.outcome == "rolled_back"
    assert upper.evaluated == ["v0/a", "v0/b", "upper-1/a", "upper-1/b"]
    assert shared.known(version("v0", "/ck/v0")) == {"a": good, "b": good}
    assert upper.known(version("v0", "/ck/v0")) == {"a": bad, "b": good}
    with engine.connect() as conn:
        (recorded,) = decisions(conn)
        assert learner_state.get_state(conn, CONFIG) == published
    assert (recorded["tenant"], recorded["version"], recorded["kept"]) == ("upper", "upper-1", "v0")
    by_type = {t["type"]: t for t in recorded["types"]}
    assert by_type["b"]["regressed"] and not by_type["a"]["regressed"]
