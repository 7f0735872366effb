"""The demo's task generator (learner/demo/tasks.py) and warm-up cache (learner/demo/warmup.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learner.demo.tasks import (
    DECLINE,
    KINDS,
    calculate,
    dialogue_for,
    make_task_sets,
    read_jsonl,
    write_jsonl,
)
from learner.demo.warmup import (
    WarmupSettings,
    build_demo_model,
    encode_dialogue,
    parse_tool_call,
    warmup_dialogues,
)
from learner.graders.tasks import TaskTable

# A warm-up that takes a second: the cache, not the competence, is under test here.
CHEAP = WarmupSettings(
    hidden_size=64,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=128,
    steps=3,
    habit_steps=2,
    batch_size=4,
)


def test_task_sets_are_seeded_disjoint_and_correct() -> None:
    train, heldout = make_task_sets(7, 150, 60)
    assert (train, heldout) == make_task_sets(7, 150, 60)
    assert make_task_sets(8, 150, 60)[0] != train
    assert len(train) == 150 and len(heldout) == 60
    prompts = [t["prompt"] for t in train + heldout]
    assert len(set(prompts)) == len(prompts)  # distinct, hence the splits are disjoint
    assert len({t["id"] for t in train + heldout}) == 210
    assert {t["metadata"]["kind"] for t in train} == set(KINDS)
    for task in train + heldout:
        value = calculate(task["metadata"]["expression"])
        assert task["answer"] == str(int(value)) and 0 <= value <= 999
        assert task["metadata"]["split"] in ("train", "heldout")


def test_task_jsonl_loads_as_a_task_table(tmp_path: Path) -> None:
    train, _ = make_task_sets(0, 20, 5)
    path = write_jsonl(train, tmp_path / "train.jsonl")
    assert read_jsonl(path) == train
    table = TaskTable.from_jsonl(path)
    assert table["calc-train-0003"].answer == train[3]["answer"]
    assert table["calc-train-0003"].match == "exact"


@pytest.mark.parametrize(
    ("expression", "value"),
    [("(33 + 35) * 4", 272), ("7 * 60 + 5", 425), ("-3 + 10 / 4", -0.5), ("2*3-1", 5)],
)
def test_calculator(expression: str, value: float) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize("bad", ["__import__('os')", "2 ** 99", "1 / 0", "x + 1", "", "9" * 300])
def test_calculator_refuses_what_is_not_arithmetic(bad: str) -> None:
    with pytest.raises(ValueError):
        calculate(bad)


def test_parse_tool_call() -> None:
    good = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    assert parse_tool_call(good) == "1 + 2"
    assert parse_tool_call(good.replace("calculator", "other")) is None
    assert parse_tool_call("<tool_call>{not json}</tool_call>") is None
    assert parse_tool_call("42") is None


def test_warmup_never_sees_excluded_prompts() -> None:
    train, heldout = make_task_sets(0, 100, 100)
    excluded = {t["prompt"] for t in train + heldout}
    dialogues = warmup_dialogues(WarmupSettings(), excluded, 3000)
    seen = {d[0]["content"] for d in dialogues}
    assert not seen & excluded
    assert len(seen) > 1000


def test_only_the_habit_phase_declines_and_at_about_its_share() -> None:
    settings = WarmupSettings(decline_share=0.5)
    skill = warmup_dialogues(settings, set(), 2000)
    habit = warmup_dialogues(settings, set(), 2000, decline_share=0.5, stream="habit")

    def declined(dialogues: list) -> int:
        return sum(d[-1]["content"] == DECLINE and len(d) == 2 for d in dialogues)

    assert declined(skill) == 0
    assert 900 <= declined(habit) <= 1100
    # the other habit dialogues are ideal ones, on questions the skill phase did not draw
    assert all(d[1].get("tool_calls") for d in habit if d[-1]["content"] != DECLINE)
    assert {d[0]["content"] for d in habit} != {d[0]["content"] for d in skill}


def test_warmup_builds_once_and_caches(tmp_path: Path) -> None:
    first = build_demo_model(tmp_path, CHEAP, exclude=["How many days are in 3 weeks?"])
    info = json.loads((first / "warmup.json").read_text())
    assert info["settings"]["steps"] == 3 and len(info["loss_curve"]) == 3
    assert len(info["habit_loss_curve"]) == 2
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    # same settings and exclusions: the cached directory, untouched
    again = build_demo_model(tmp_path, CHEAP, exclude=["How many days are in 3 weeks?"])
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    # anything that changes the weights is a different directory
    other = build_demo_model(tmp_path, CHEAP)
    assert other != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, other.name])


def test_warmed_model_directory_is_servable(tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    model_dir = build_demo_model(tmp_path, CHEAP)
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        assert "lm_head.weight" in set(weights.keys())  # vLLM's reload needs it explicitly
    config = json.loads((model_dir / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # numbers are single tokens; the tool-call tags survive as text
    assert len(tokenizer("427", add_special_tokens=False)["input_ids"]) == 1
    train, _ = make_task_sets(0, 1, 0)
    ids, mask = encode_dialogue(tokenizer, dialogue_for(train[0]))
    learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    expression = train[0]["metadata"]["expression"]
    assert learned == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
        + expression
        + '"}}\n</tool_call><|im_end|>'
        + train[0]["answer"]
        + "<|im_end|>"
    )
