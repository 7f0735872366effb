"""learner/rollout/tool_tasks/tasks.py: seeded, disjoint splits; every task solved by its
gold calls; the tasks that take two tools cannot be done with one; the task-set rows."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from learner.rollout.taskset import load_task_set
from learner.rollout.tool_tasks.grading import score
from learner.rollout.tool_tasks.tasks import (
    GRADER,
    KIND_ORDER,
    MAX_SEED,
    SPLIT_SIZES,
    SPLITS,
    ToolTask,
    ToolTaskRow,
    _Gold,
    _Streams,
    generate,
    make_task_sets,
    read_jsonl,
    split_of,
    task_by_key,
    write_jsonl,
)
from learner.rollout.tool_tasks.teacher import gold_messages
from learner.rollout.tool_tasks.tools import run_tool
from store.grader_specs import parse_spec
from store.tasks import parse_task

TRAIN, HELDOUT = make_task_sets(0, 240, 60)
ALL = TRAIN + HELDOUT
TWO_TOOLS = [t for t in ALL if len(t.tools) == 2]
HELDOUT_END = make_task_sets(0, 0, SPLIT_SIZES["heldout"])[1][-1]


def _signature(task: ToolTask) -> str:
    return json.dumps([[c["name"], c["arguments"]] for c in task.gold], sort_keys=True)


def test_the_splits_share_no_question_nor_gold_calls() -> None:
    assert len(TRAIN) == 240 and len(HELDOUT) == 60
    for split, tasks in (("train", TRAIN), ("heldout", HELDOUT)):
        assert {t.split for t in tasks} == {split}
        assert len({t.prompt for t in tasks}) == len({_signature(t) for t in tasks}) == len(tasks)
        assert all(split_of(_signature(t)) == split for t in tasks)
    assert not {t.prompt for t in TRAIN} & {t.prompt for t in HELDOUT}
    assert not {_signature(t) for t in TRAIN} & {_signature(t) for t in HELDOUT}
    # another seed's held-out split never holds this seed's training tasks either
    _, other = make_task_sets(1, 0, 60)
    assert not {_signature(t) for t in TRAIN} & {_signature(t) for t in other}


def test_the_same_seed_gives_the_same_tasks_and_a_longer_set_extends_a_shorter() -> None:
    assert make_task_sets(0, 240, 60) == (TRAIN, HELDOUT)
    assert make_task_sets(0, 30, 10) == (TRAIN[:30], HELDOUT[:10])
    other_train, other_heldout = make_task_sets(1, 240, 60)
    assert [t.prompt for t in other_train] != [t.prompt for t in TRAIN]
    assert [t.prompt for t in other_heldout] != [t.prompt for t in HELDOUT]


def test_ids_name_the_task_for_good() -> None:
    assert [t.id for t in TRAIN[:2]] == ["tools-0-train-0000", "tools-0-train-0001"]
    assert HELDOUT[59].id == "tools-0-heldout-0059"
    for task in (TRAIN[0], TRAIN[239], HELDOUT[17]):
        assert task_by_key(task.id) == task
    assert task_by_key("tools-3-train-0005") == make_task_sets(3, 6, 0)[0][5]


@pytest.mark.parametrize(
    "key",
    [
        "tools-0-eval-0001",
        "calc-train-0001",
        "tools-x-train-1",
        "tools-0-train",
        "",
        "tools",
        "tools-\u00b2-train-1",  # a digit to str.isdigit, not to int
        "tools-0-train-0001-x",
        "tools-" + "9" * 5000 + "-train-1",
        "tools-0-train-" + "9" * 5000,
    ],
)
def test_a_key_of_no_tool_task_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="is not a tools task id"):
        task_by_key(key)


def test_each_split_holds_as_many_tasks_for_every_seed() -> None:
    for seed in (0, 1, 99):
        for split in SPLITS:
            size = SPLIT_SIZES[split]
            stream = generate(seed, split)
            assert len([next(stream) for _ in range(size)]) == size
            with pytest.raises(ValueError, match=f"the {split} split has no new"):
                next(stream)


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ("tools-0-train-0518", r"the train split has 518 tasks \(index 0 to 517\)"),
        ("tools-0-heldout-0178", r"the heldout split has 178 tasks \(index 0 to 177\)"),
        (f"tools-{MAX_SEED + 1}-train-0001", f"the seed must be 0 to {MAX_SEED}"),
    ],
)
def test_a_key_past_its_split_or_the_seeds_is_refused(key: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        task_by_key(key)


def test_the_last_seed_and_index_name_tasks_and_no_stream_goes_past_them() -> None:
    assert task_by_key(f"tools-{MAX_SEED}-heldout-0177").split == "heldout"
    with pytest.raises(ValueError, match="the seed must be 0 to"):
        next(generate(MAX_SEED + 1, "train"))


def test_a_lookup_past_the_end_of_a_stream_says_so_every_time() -> None:
    streams = _Streams()
    last = SPLIT_SIZES["heldout"] - 1
    assert streams.task(0, "heldout", last) == HELDOUT_END
    for index in (last + 1, last + 1, last + 50):  # the stream has ended: no StopIteration
        with pytest.raises(
            ValueError,
            match=r"no task tools-0-heldout-0\d+: the heldout split ends after 178 tasks",
        ):
            streams.task(0, "heldout", index)
    assert streams.task(0, "heldout", last) == HELDOUT_END


def test_the_streams_kept_are_the_last_used() -> None:
    streams = _Streams(max_streams=2)
    first = streams.task(0, "train", 3)
    streams.task(1, "train", 3)
    streams.task(0, "train", 1)  # seed 0 used last: seed 1 goes first
    streams.task(2, "train", 3)
    assert len(streams) == 2
    assert list(streams._made) == [(0, "train"), (2, "train")]
    for seed in range(3, 40):
        streams.task(seed, "heldout", 0)
    assert len(streams) == 2
    assert streams.task(0, "train", 3) == first == TRAIN[3]  # made again, the same


def test_kinds_come_in_turn_and_every_task_takes_two_model_turns_or_more() -> None:
    assert [t.kind for t in TRAIN[:12]] == list(KIND_ORDER) * 2
    tools = {t.kind: t.tools for t in ALL}
    assert tools == {
        "arithmetic": ["calculator"],
        "convert": ["convert"],
        "lookup": ["lookup"],
        "lookup_calc": ["lookup", "calculator"],
        "lookup_convert": ["lookup", "convert"],
        "lookups_calc": ["lookup", "calculator"],
    }
    for task in ALL:  # a tool call, its result, then the answer: two model turns or more
        turns = [m for m in gold_messages(task) if m["role"] == "assistant"]
        assert len(turns) >= 2 and len(turns) == len(task.gold) + 1
        assert all(turn.get("tool_calls") for turn in turns[:-1])
        assert "tool_calls" not in turns[-1] and turns[-1]["content"] == task.answer
    assert {len(t.gold) for t in ALL if t.kind == "lookups_calc"} == {3}


def test_the_gold_calls_solve_every_task() -> None:
    for task in ALL:
        for call in task.gold:
            result = run_tool(call["name"], json.dumps(call["arguments"]))
            assert (result.content, result.error) == (call["result"], None), task
        assert task.answer == task.gold[-1]["result"]
        assert score(task.answer, task.answer).reward == 1.0


def test_a_task_that_takes_two_tools_cannot_be_done_with_one() -> None:
    assert len(TWO_TOOLS) == 150  # half of the tasks
    for task in TWO_TOOLS:
        asked = set(re.findall(r"\d+(?:\.\d+)?", task.prompt))
        *earlier, last = task.gold
        for call in earlier:
            # the value is nowhere in the question: the second tool needs the first's result
            assert call["result"] not in asked, task
            assert call["result"] in json.dumps(last["arguments"]), task
            # and the first tool's result is not the answer
            assert score(call["result"], task.answer).reward == 0.0, task
        assert last["name"] != "lookup"


def test_a_kind_that_runs_out_says_so() -> None:
    with pytest.raises(
        ValueError, match=r"the heldout split has no new \w+ task left after \d+ tasks"
    ):
        make_task_sets(0, 0, 400)
    with pytest.raises(ValueError, match="unknown split 'eval'"):
        next(generate(0, "eval"))


def test_rows_are_task_set_lines_that_round_trip(tmp_path: Path) -> None:
    row = TRAIN[3].row()
    assert row["grader"] == GRADER and parse_spec(GRADER)[0] == "python"
    assert (row["match"], row["metadata"]["family"], row["metadata"]["tools"]) == (
        "numeric",
        "tools",
        ["lookup", "calculator"],
    )
    task = parse_task(json.dumps(row), where="row")
    assert (task.key, task.answer, task.grader) == (TRAIN[3].id, TRAIN[3].answer, GRADER)
    path = write_jsonl(TRAIN[:20], tmp_path / "sets" / "tools-train.jsonl")
    assert read_jsonl(path) == TRAIN[:20]
    loaded = load_task_set(path)
    assert loaded.name == "tools-train" and list(loaded.tasks) == [t.id for t in TRAIN[:20]]
    with pytest.raises(ValueError, match="is not a tools task"):
        ToolTask.from_row({"id": "x", "prompt": "p", "answer": "1", "metadata": {}})


def _without(row: ToolTaskRow, *path: str) -> Any:
    """`row` with the field at `path` taken out (list indexes as digits)."""
    changed = json.loads(json.dumps(row))
    *parents, last = path
    where = changed
    for key in parents:
        where = where[int(key)] if isinstance(where, list) else where[key]
    del where[int(last) if isinstance(where, list) else last]
    return changed


@pytest.mark.parametrize(
    ("path", "error"),
    [
        (("prompt",), "task 'tools-0-train-0003' lacks prompt"),
        (("answer",), "task 'tools-0-train-0003' lacks answer"),
        (("id",), "task None lacks id"),
        (("metadata", "kind"), "the metadata of task 'tools-0-train-0003' lacks kind"),
        (("metadata", "split"), "the metadata of task .* lacks split"),
        (("metadata", "gold"), "has no gold calls"),
        (("metadata", "gold", "0", "name"), "the gold call .* lacks name"),
        (("metadata", "gold", "1", "result"), "the gold call .* lacks result"),
        (("metadata", "gold", "0", "arguments"), "not a gold call \\(name, arguments, result\\)"),
    ],
)
def test_a_row_missing_a_field_is_a_value_error(path: tuple[str, ...], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ToolTask.from_row(_without(TRAIN[3].row(), *path))


@pytest.mark.parametrize("line", ["[1, 2]", '"a task"', "null", '{"metadata": {"gold": [1]}}'])
def test_a_line_that_is_no_row_is_a_value_error(line: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(ValueError):
        read_jsonl(path)


def test_a_gold_call_that_fails_raises() -> None:
    with pytest.raises(
        RuntimeError, match=r"a gold call failed: lookup .*no entry named 'Atlantis'"
    ):
        _Gold().call("lookup", name="Atlantis", field="population")
