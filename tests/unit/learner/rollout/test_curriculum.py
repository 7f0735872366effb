"""Curriculum files: what loads, errors that name the file, the stage and the field; the
promotion rule; an eval's numbers from its eval_results rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learner.rollout.curriculum import (
    CurriculumError,
    EvalPoint,
    PromotionRule,
    load_curriculum,
)
from learner.rollout.curriculum_runner import eval_metrics

GOOD = """
name = "arith"
tasks_per_round = 4
eval_every = 3
seed = 7

[[stages]]
name = "qa"
tasks = "qa.jsonl"
eval = "qa-eval.jsonl"
promote = { metric = "pass_at_1", at_least = 0.7, over_last = 2 }
command = ["python", "qa.py", "{prompt}"]

[[stages]]
name = "tools"
tasks = "tools.jsonl"
eval = "tools-eval.jsonl"
promote = { at_least = 0.5 }
replay = 0.25
eval_samples = 2
"""


def task_files(root: Path) -> None:
    sets = {
        "qa.jsonl": [{"id": "q1", "prompt": "1+1", "answer": "2"}, {"id": "q2", "prompt": "2+2"}],
        "qa-eval.jsonl": [{"id": "qe1", "prompt": "3+3", "answer": "6"}],
        "tools.jsonl": [{"id": "t1", "prompt": "7*6", "answer": "42"}],
        "tools-eval.jsonl": [{"id": "te1", "prompt": "8*6", "answer": "48"}],
    }
    for name, rows in sets.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def write(tmp_path: Path, text: str) -> Path:
    task_files(tmp_path)
    path = tmp_path / "curriculum.toml"
    path.write_text(text)
    return path


def test_a_good_file_loads_with_its_defaults_and_overrides(tmp_path: Path) -> None:
    curriculum = load_curriculum(write(tmp_path, GOOD))
    assert curriculum.name == "arith" and curriculum.seed == 7
    qa, tools = curriculum.stages
    assert (qa.name, qa.index, tools.index) == ("qa", 0, 1)
    assert qa.rule == PromotionRule(at_least=0.7, metric="pass_at_1", over_last=2)
    assert tools.rule == PromotionRule(at_least=0.5)  # pass@1 over the last eval
    assert list(qa.tasks.tasks) == ["q1", "q2"] and list(qa.eval.tasks) == ["qe1"]
    assert qa.tasks.name == "curriculum:arith:qa:train"
    assert tools.eval.name == "curriculum:arith:tools:eval"
    assert qa.command == ["python", "qa.py", "{prompt}"] and tools.command is None
    assert (qa.tasks_per_round, qa.eval_every, qa.eval_samples) == (4, 3, 4)
    assert (tools.eval_samples, tools.replay, qa.replay) == (2, 0.25, 0.0)
    assert tools.replay_count() == 1 and qa.replay_count() == 0
    assert list(curriculum.earlier_tasks(tools)) == ["q1", "q2"]
    assert list(curriculum.earlier_tasks(qa)) == []
    assert curriculum.stage("tools") is tools and curriculum.stage("nope") is None
    assert [s["name"] for s in curriculum.state()] == ["qa", "tools"]


def test_the_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('name = "arith"\n', "", 1))
    assert load_curriculum(path).name == "curriculum"


def test_a_small_replay_share_still_replays_one_task(tmp_path: Path) -> None:
    curriculum = load_curriculum(write(tmp_path, GOOD.replace("replay = 0.25", "replay = 0.05")))
    assert curriculum.stages[1].replay_count() == 1


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('tasks = "tools.jsonl"', 'tasks = "missing.jsonl"',
         "stage 2 ('tools'): field 'tasks': "),
        ('tasks = "tools.jsonl"', "tasks = 3", "stage 2 ('tools'): field 'tasks': expected"),
        ('eval = "qa-eval.jsonl"', "", "stage 1 ('qa'): field 'eval': expected the path"),
        ("at_least = 0.5", "at_least = 1.5",
         "stage 2 ('tools'): field 'promote.at_least': pass_at_1 is a share"),
        ("at_least = 0.5", 'at_least = "high"', "field 'promote.at_least': expected a number"),
        ('metric = "pass_at_1"', 'metric = "accuracy"',
         "stage 1 ('qa'): field 'promote.metric': expected one of pass_at_1"),
        ("over_last = 2", "over_last = 0", "field 'promote.over_last': expected an integer"),
        ("over_last = 2", "over_last = 2, when = 1", "field 'promote.when': unknown"),
        ("promote = { at_least = 0.5 }", "", "stage 2 ('tools'): field 'promote': expected"),
        ("replay = 0.25", "replay = 1.0", "stage 2 ('tools'): field 'replay': expected a share"),
        ('name = "tools"', 'name = "qa"', "stage 2 ('qa'): field 'name': a stage 'qa' comes"),
        ('name = "tools"', 'name = "a:b"', "field 'name': expected 1-80 characters without"),
        ('command = ["python", "qa.py", "{prompt}"]', 'command = "python qa.py"',
         "stage 1 ('qa'): field 'command': expected a list of strings"),
        ("eval_samples = 2", "eval_samples = 0", "stage 2 ('tools'): field 'eval_samples'"),
        ("eval_samples = 2", "evals = 2", "stage 2 ('tools'): field 'evals': unknown"),
        ("eval_every = 3", "eval_every = 2.5", "curriculum.toml: field 'eval_every': expected"),
        ("seed = 7", "sead = 7", "curriculum.toml: field 'sead': unknown"),
        ('name = "arith"', 'name = "a:b"', "curriculum.toml: field 'name': must not contain"),
    ],
)  # fmt: skip
def test_mistakes_name_the_file_the_stage_and_the_field(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(CurriculumError) as caught:
        load_curriculum(path)
    assert str(caught.value).startswith(str(path)), caught.value
    assert message in str(caught.value)


def test_the_first_stage_has_nothing_to_replay(tmp_path: Path) -> None:
    text = GOOD.replace("command = [", "replay = 0.5\ncommand = [", 1)
    with pytest.raises(CurriculumError, match=r"stage 1 \('qa'\): field 'replay': the first"):
        load_curriculum(write(tmp_path, text))


def test_replay_needs_room_in_a_round(tmp_path: Path) -> None:
    text = GOOD.replace("replay = 0.25", "replay = 0.25\ntasks_per_round = 1")
    with pytest.raises(CurriculumError, match="needs tasks_per_round of at least 2"):
        load_curriculum(write(tmp_path, text))


def test_not_toml_and_not_there(tmp_path: Path) -> None:
    with pytest.raises(CurriculumError, match="not valid TOML"):
        load_curriculum(write(tmp_path, "name = = 1"))
    with pytest.raises(CurriculumError, match=r"'stages': expected at least one \[\[stages\]\]"):
        load_curriculum(write(tmp_path, 'name = "empty"\n'))
    with pytest.raises(CurriculumError, match="cannot read"):
        load_curriculum(tmp_path / "absent.toml")


def test_a_bad_task_line_is_named_through_the_stage(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    (tmp_path / "tools-eval.jsonl").write_text('{"id": "te1", "match": "fuzzy"}\n')
    with pytest.raises(CurriculumError) as caught:
        load_curriculum(path)
    text = str(caught.value)
    assert "stage 2 ('tools'): field 'eval':" in text
    assert "tools-eval.jsonl line 1: field 'match'" in text


def test_a_task_id_means_one_task_across_the_curriculum(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    (tmp_path / "tools.jsonl").write_text('{"id": "q1", "prompt": "something else"}\n')
    with pytest.raises(CurriculumError, match="task id 'q1' is a different task in stage 1"):
        load_curriculum(path)
    # the same task in two sets is fine (e.g. a training task kept in the eval split)
    (tmp_path / "tools.jsonl").write_text('{"id": "q1", "prompt": "1+1", "answer": "2"}\n')
    assert list(load_curriculum(path).stages[1].tasks.tasks) == ["q1"]


def point(**metrics: float | None) -> EvalPoint:
    return EvalPoint(metrics)


def test_the_rule_needs_its_window_of_evals_and_their_mean() -> None:
    rule = PromotionRule(at_least=0.7, over_last=2)
    assert rule.check([]).holds is False
    one = rule.check([point(pass_at_1=1.0)])
    assert (one.holds, one.evals) == (False, 1)  # one eval of the two it needs
    # the mean of the last two: 0.6 and 0.8 -> 0.7 holds (counted shares are not rounded off)
    verdict = rule.check([point(pass_at_1=0.0), point(pass_at_1=0.6), point(pass_at_1=0.8)])
    assert verdict.holds and verdict.value == pytest.approx(0.7) and verdict.evals == 2
    assert rule.check([point(pass_at_1=0.9), point(pass_at_1=0.4)]).holds is False
    assert rule.check([point(pass_at_1=0.7 * 3 / 3), point(pass_at_1=7 / 10)]).holds
    # an eval without graded runs counts as nothing passed
    assert rule.check([point(pass_at_1=1.0), point(pass_at_1=None)]).holds is False


def test_the_rule_reads_its_metric() -> None:
    rule = PromotionRule(at_least=0.5, metric="mean_reward")
    assert rule.check([point(pass_at_1=0.0, mean_reward=0.6)]).holds
    assert not rule.check([point(pass_at_1=1.0, mean_reward=0.4)]).holds
    assert rule.describe() == "mean reward >= 0.5 over the last eval"
    assert PromotionRule(0.7, "pass_at_k", 3).describe() == "pass@k >= 0.7 over the last 3 evals"


def test_eval_metrics_pool_versions_and_tasks() -> None:
    rows = [
        # task a: 3 runs by v1 (2 right), 1 by v2 (right); task b: 4 runs by v2 (none right)
        {"task_key": "a", "policy_version": "v1", "runs": 3, "successes": 2, "mean_reward": 2 / 3},
        {"task_key": "a", "policy_version": "v2", "runs": 1, "successes": 1, "mean_reward": 1.0},
        {"task_key": "b", "policy_version": "v2", "runs": 4, "successes": 0, "mean_reward": 0.25},
    ]  # fmt: skip
    metrics = eval_metrics(rows, k=2)
    assert metrics["runs"] == 8 and metrics["k"] == 2
    assert metrics["pass_at_1"] == pytest.approx(3 / 8)
    assert metrics["mean_reward"] == pytest.approx((2 + 1 + 1) / 8)
    # task a: 4 runs, 3 right -> pass@2 = 1 - C(1,2)/C(4,2) = 1; task b: 0
    assert metrics["pass_at_k"] == pytest.approx(0.5)
    assert metrics["policy_version"] == "v2"  # 5 of the 8 runs
    empty = eval_metrics([], k=2)
    assert empty["runs"] == 0 and empty["pass_at_1"] is None
