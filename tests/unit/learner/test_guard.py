"""The regression guard's rule (learner/guard.py): margin, noise floor, protected, waiver;
and its file."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from learner.guard import (
    GuardConfig,
    GuardedType,
    GuardFileError,
    Score,
    Waiver,
    config_state,
    decide,
    noise,
    worst_case_noise,
)
from learner.rollout.taskset import TaskSet
from store.tasks import TaskTable

TASKS = TaskSet("t", TaskTable({}))  # the rule never looks at the tasks


def guarded(name: str, *, protected: bool = False, margin: float = 0.10) -> GuardedType:
    return GuardedType(name, TASKS, ["true"], margin=margin, protected=protected)


def config(*types: GuardedType, z: float = 2.0) -> GuardConfig:
    return GuardConfig(proxy_url="http://127.0.0.1:1", types=list(types), z=z)


def test_noise_is_z_sds_of_the_difference_of_two_binomial_evals() -> None:
    # 64 runs each at p = 0.5: sd of the difference sqrt(2 * 0.25 / 64) = 0.0884
    assert noise(Score(0.5, 64), Score(0.5, 64), 2.0) == pytest.approx(2 * math.sqrt(0.5 / 64))
    assert worst_case_noise(64, 2.0) == pytest.approx(0.1768, abs=1e-4)
    assert noise(Score(1.0, 10), Score(0.0, 10), 2.0) == 0.0  # no variance at 0 and 1


def test_a_drop_beyond_the_margin_and_the_noise_rolls_back() -> None:
    rule = config(guarded("trained"), guarded("other"))
    before = {"trained": Score(0.2, 400), "other": Score(0.8, 400)}
    after = {"trained": Score(0.6, 400), "other": Score(0.6, 400)}
    decision = decide(rule, before, after)
    assert decision.outcome == "rolled_back"
    trained, other = decision.verdicts
    assert not trained.regressed  # it improved
    # noise at 400 runs: 2 * sqrt(.16/400 + .24/400) = 0.063 < margin 0.10
    assert other.regressed and other.allowed == pytest.approx(0.10)
    assert other.drop == pytest.approx(0.2)
    assert "other pass_at_1 0.800 -> 0.600" in decision.reason


def test_a_drop_within_the_margin_is_kept() -> None:
    rule = config(guarded("other"))
    decision = decide(rule, {"other": Score(0.8, 400)}, {"other": Score(0.72, 400)})
    assert decision.outcome == "kept" and not decision.verdicts[0].regressed


def test_the_noise_floor_overrides_a_margin_below_it() -> None:
    """At 16 runs a drop of 0.25 is within 2 sd: a margin of 0.05 alone would roll back."""
    rule = config(guarded("other", margin=0.05))
    decision = decide(rule, {"other": Score(0.5, 16)}, {"other": Score(0.25, 16)})
    (verdict,) = decision.verdicts
    assert verdict.allowed == pytest.approx(noise(Score(0.5, 16), Score(0.25, 16), 2.0))
    assert verdict.allowed > 0.25 and decision.outcome == "kept"


def test_a_protected_type_tolerates_only_the_noise() -> None:
    before, after = {"p": Score(0.8, 400)}, {"p": Score(0.72, 400)}  # drop 0.08 < margin
    assert decide(config(guarded("p")), before, after).outcome == "kept"
    decision = decide(config(guarded("p", protected=True)), before, after)
    assert decision.outcome == "rolled_back"
    assert decision.verdicts[0].allowed == pytest.approx(
        noise(before["p"], after["p"], 2.0)
    )  # 0.058
    assert "(protected)" in decision.reason


def test_a_type_without_an_eval_is_skipped_unless_protected() -> None:
    before = {"a": Score(0.5, 32), "p": Score(0.5, 32)}
    after = {"a": Score(0.5, 32)}  # p's eval had no graded runs
    assert decide(config(guarded("a"), guarded("b")), before, after).outcome == "kept"
    decision = decide(config(guarded("a"), guarded("p", protected=True)), before, after)
    assert decision.outcome == "rolled_back"
    assert "had no graded runs" in decision.reason


def test_a_waiver_lets_unprotected_types_through_and_protected_only_when_named() -> None:
    rule = config(guarded("u"), guarded("p", protected=True))
    before = {"u": Score(0.9, 400), "p": Score(0.9, 400)}
    only_u = {"u": Score(0.5, 400), "p": Score(0.9, 400)}
    both = {"u": Score(0.5, 400), "p": Score(0.5, 400)}
    assert decide(rule, before, only_u).outcome == "rolled_back"
    assert decide(rule, before, only_u, Waiver()).outcome == "waived"
    # a blanket waiver does not cover a protected type
    assert decide(rule, before, both, Waiver()).outcome == "rolled_back"
    assert decide(rule, before, both, Waiver(types=["u"])).outcome == "rolled_back"
    waived = decide(rule, before, both, Waiver(types=["u", "p"]))
    assert waived.outcome == "waived" and all(v.waived for v in waived.verdicts)
    # nothing regressed: kept, and no verdict says it was waived
    kept = decide(rule, before, before, Waiver())
    assert kept.outcome == "kept" and not any(v.waived for v in kept.verdicts)
    assert Waiver.from_state(Waiver(types=["p"], reason="r").state()) == Waiver(["p"], "r")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_guard_file(tmp_path: Path) -> None:
    task = {"id": "e1", "prompt": "2+2?", "answer": "4"}
    (tmp_path / "qa.jsonl").write_text(json.dumps(task) + "\n")
    file = write(
        tmp_path / "guard.toml",
        """
proxy = "http://127.0.0.1:8080"
command = ["python", "agent.py"]
[types.qa]
tasks = "qa.jsonl"
samples = 8
margin = 0.15
[types.tools]
tasks = "qa.jsonl"
protected = true
command = ["python", "tools.py"]
metric = "mean_reward"
""",
    )
    loaded = GuardConfig.load(file)
    qa, tools = loaded.types
    assert (qa.name, qa.samples, qa.margin, qa.protected, qa.command, qa.runs) == (
        "qa", 8, 0.15, False, ["python", "agent.py"], 8,
    )  # fmt: skip
    assert qa.tasks.name == "guard:qa" and list(qa.tasks.tasks) == ["e1"]
    assert (tools.protected, tools.command, tools.metric) == (True, ["python", "tools.py"],
                                                               "mean_reward")  # fmt: skip


def test_a_tenants_guard_is_its_own_types_and_the_shared_ones_it_names(tmp_path: Path) -> None:
    """learn --tenants: a tenant's versions are judged on its own eval sets and on the shared
    types its entry names, every one of them run with the tenant's environment (its client
    key), so that its adapter answers them; a tenant without an entry is not guarded."""
    (tmp_path / "qa.jsonl").write_text(json.dumps({"id": "e", "prompt": "p", "answer": "a"}))
    file = write(
        tmp_path / "guard.toml",
        """
proxy = "http://127.0.0.1:8080"
command = ["python", "agent.py"]
[types.safety]
tasks = "qa.jsonl"
protected = true
env = { SAFE = "1" }
[types.other]
tasks = "qa.jsonl"
[tenants.upper]
shared = ["safety"]
env = { OPENAI_API_KEY = "sk-upper" }
[tenants.upper.types.caps]
tasks = "qa.jsonl"
samples = 2
""",
    )
    loaded = GuardConfig.load(file)
    assert [t.name for t in loaded.types] == ["safety", "other"]
    upper = loaded.for_tenant("upper")
    assert upper is not None and upper.tenants == {}
    assert [(t.name, t.protected, t.samples) for t in upper.types] == [
        ("caps", False, 2),
        ("safety", True, 4),
    ]
    assert upper.types[0].env == {"OPENAI_API_KEY": "sk-upper"}
    assert upper.types[1].env == {"SAFE": "1", "OPENAI_API_KEY": "sk-upper"}
    assert loaded.types[0].env == {"SAFE": "1"}  # the shared policy's evals are its own
    assert loaded.for_tenant("lower") is None
    state = config_state(loaded)
    assert state["tenants"]["upper"]["shared"] == ["safety"]
    assert [t["type"] for t in state["tenants"]["upper"]["types"]] == ["caps"]
    # a file of tenants' entries alone is valid
    only = write(
        tmp_path / "only.toml",
        'proxy = "http://x"\ncommand = ["x"]\n[tenants.t.types.a]\ntasks = "qa.jsonl"\n',
    )
    assert GuardConfig.load(only).types == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[types.a]\ntasks = "qa.jsonl"\ncommand = ["x"]', "proxy"),
        ('proxy = "http://x"', "no [types.NAME]"),
        ('proxy = "http://x"\n[types.a]\ntasks = "qa.jsonl"', "command must be"),
        ('proxy = "http://x"\n[types.a]\ncommand = ["x"]', "tasks (the eval task set)"),
        ('proxy = "http://x"\nmargins = 1\n[types.a]\ntasks = "qa.jsonl"', "unknown settings"),
        ('proxy = "http://x"\n[types.a]\ntasks = "qa.jsonl"\ncommand = ["x"]\nmetric = "f1"',
         "metric must be"),
        ('proxy = "http://x"\n[types.a]\ntasks = "none.jsonl"\ncommand = ["x"]', "none.jsonl"),
        ('proxy = "http://x"\ncommand = ["x"]\n[tenants.t]\nenv = {K = "v"}',
         "tenants.t: no [tenants.t.types.NAME] and no shared"),
        ('proxy = "http://x"\ncommand = ["x"]\n[tenants.t]\nshared = ["safety"]',
         "tenants.t: shared names safety, not in [types]"),
        ('proxy = "http://x"\ncommand = ["x"]\n[types.a]\ntasks = "qa.jsonl"\n'
         '[tenants.t]\nshared = ["a"]\n[tenants.t.types.a]\ntasks = "qa.jsonl"',
         "tenants.t: a is both its own and shared"),
        ('proxy = "http://x"\ncommand = ["x"]\n[tenants.t]\nkey = "k"', "unknown settings key"),
        ('proxy = "http://x"\n[tenants.t.types.a]\ntasks = "qa.jsonl"',
         "tenants.t.types.a: command must be"),
    ],
)  # fmt: skip
def test_a_bad_guard_file_names_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "qa.jsonl").write_text(json.dumps({"id": "e", "prompt": "p", "answer": "a"}))
    with pytest.raises(GuardFileError, match=re.escape(message)):
        GuardConfig.load(write(tmp_path / "guard.toml", text))
