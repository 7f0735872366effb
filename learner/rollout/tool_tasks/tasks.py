"""The tool tasks: seeded questions that take one or two tools in sequence, each with its
reference answer and its gold tool-call sequence.

Six kinds, in turn (task i of a split is of kind KIND_ORDER[i % 6]):

| kind | gold calls | example |
|---|---|---|
| arithmetic | calculator | What is 348 times 27, plus 115? |
| convert | convert | How many miles are in 42 kilometers? |
| lookup | lookup | What is the population of Varnholt? |
| lookup_calc | lookup, calculator | How much do 7 Zephyr stools cost in total, in dollars? |
| lookup_convert | lookup, convert | What is the elevation of Varnholt in feet? |
| lookups_calc | lookup x2, calculator | How many more people live in Quellby than in Brolley? |

So every task takes at least two model turns (a tool call, then the answer after its
result), half of them three or four. The tool and its arguments must be read off the
question: "weigh in kilograms" is a lookup, "weigh in pounds" a lookup then a conversion;
the towns and products are fictional (facts.py), so no value can be known without the tool.

Splits: a task belongs to the held-out split when the hash of its gold calls says so (a
quarter of all tasks), so the two splits never share a question, nor two phrasings of
one. Each split is its own seeded stream: `make_task_sets(seed, n, m)` gives the first n and
m of them, the same for the same seed, and a longer set starts with a shorter one's tasks.
A split holds SPLIT_SIZES tasks (518 train, 178 held-out) for any seed 0 to MAX_SEED.
Hence a task id (`tools-<seed>-<split>-<index>`) names its task for good, and the grader
(grading.py) finds a task from its id alone (`task_by_key`).

A task row (`ToolTask.row()`) is in the task-set format of `onthejob tasks load` and
`onthejob rollout --tasks`: a numeric reference `answer` (the `reference` grader works) and
`grader` = this family's grader, which gives half credit to an answer rounded too far;
`metadata.gold` holds the gold calls with their results, from which the scripted teacher
(teacher.py) answers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from learner.rollout.tool_tasks.facts import PRODUCTS, TOWNS
from learner.rollout.tool_tasks.tools import run_tool

if TYPE_CHECKING:
    from store.json_types import JsonObject, JsonValue

FAMILY = "tools"
SPLITS = ("train", "heldout")
HELDOUT_BUCKETS = 64  # of 256: a quarter of all tasks are held out
GRADER = "python:learner.rollout.tool_tasks.grading:grade"
TOLERANCE = 0.005  # answers are rounded to 2 decimals, as the tools round them
MAX_DRAWS = 5000  # tries for a task not yet drawn in its split before the kind is used up
# How many tasks each split holds, whatever the seed: a split ends where its first kind runs
# out of tasks not yet drawn (lookup in train, lookup_convert in held-out), and which tasks
# a kind has in a split is fixed by the hash of their gold calls, not by the seed.
SPLIT_SIZES = {"train": 518, "heldout": 178}
MAX_SEED = 2**32 - 1
MAX_STREAMS = 8  # (seed, split) streams task_by_key keeps, the last used


class GoldCall(TypedDict):
    name: str
    arguments: JsonObject
    result: str  # what the tool answered


class ToolTaskMetadata(TypedDict):
    family: str
    kind: str
    split: str
    tools: list[str]  # the tools the gold calls use, in the order of first use
    gold: list[GoldCall]


class ToolTaskRow(TypedDict):
    """A line of the task-set format (store/tasks.py)."""

    id: str
    prompt: str
    answer: str
    match: str
    tolerance: float
    grader: str
    metadata: ToolTaskMetadata


@dataclass(frozen=True)
class ToolTask:
    id: str
    prompt: str
    answer: str  # the last gold call's result
    kind: str
    split: str
    gold: tuple[GoldCall, ...]

    @property
    def tools(self) -> list[str]:
        return list(dict.fromkeys(call["name"] for call in self.gold))

    def row(self) -> ToolTaskRow:
        metadata: ToolTaskMetadata = {
            "family": FAMILY,
            "kind": self.kind,
            "split": self.split,
            "tools": self.tools,
            "gold": list(self.gold),
        }
        return {
            "id": self.id,
            "prompt": self.prompt,
            "answer": self.answer,
            "match": "numeric",
            "tolerance": TOLERANCE,
            "grader": GRADER,
            "metadata": metadata,
        }

    @classmethod
    def from_row(cls, row: JsonValue) -> ToolTask:
        """A task from its row (a task file's line); ValueError if it is not one of ours."""
        if not isinstance(row, dict):
            raise ValueError(f"not a task row: {row!r:.200}")
        metadata = row.get("metadata")
        if not isinstance(metadata, dict) or metadata.get("family") != FAMILY:
            raise ValueError(f"task {row.get('id')!r:.80} is not a {FAMILY} task")
        _require(row, ("id", "prompt", "answer"), f"task {row.get('id')!r:.80}")
        _require(metadata, ("kind", "split"), f"the metadata of task {row['id']!r:.80}")
        gold = metadata.get("gold")
        if not isinstance(gold, list) or not gold:
            raise ValueError(f"task {row['id']!r:.80} has no gold calls")
        return cls(
            id=str(row["id"]),
            prompt=str(row["prompt"]),
            answer=str(row["answer"]),
            kind=str(metadata["kind"]),
            split=str(metadata["split"]),
            gold=tuple(_gold_call(call) for call in gold),
        )


def _require(fields: JsonObject, keys: tuple[str, ...], what: str) -> None:
    missing = [key for key in keys if key not in fields]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")


def _gold_call(call: JsonValue) -> GoldCall:
    arguments = call.get("arguments") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(arguments, dict):
        raise ValueError(f"not a gold call (name, arguments, result): {call!r:.200}")
    _require(call, ("name", "result"), f"the gold call {call!r:.200}")
    return {"name": str(call["name"]), "arguments": arguments, "result": str(call["result"])}


# ---- drawing one task of a kind


class _Gold:
    """Runs the gold calls as a kind draws them, so every result is the tool's own."""

    def __init__(self) -> None:
        self.calls: list[GoldCall] = []

    def call(self, tool: str, /, **arguments: JsonValue) -> str:
        """The tool's result; RuntimeError if it failed (a kind that draws a bad call is a bug
        here, never a task)."""
        result = run_tool(tool, arguments)
        if result.error is not None:
            raise RuntimeError(f"a gold call failed: {tool} {arguments}: {result.content}")
        self.calls.append({"name": tool, "arguments": arguments, "result": result.content})
        return result.content

    def signature(self) -> str:
        return json.dumps([[c["name"], c["arguments"]] for c in self.calls], sort_keys=True)


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


def _an(product: str) -> str:
    return f"{'an' if product[0] in 'AEIOU' else 'a'} {product}"


UNIT_NAMES = {
    "m": "meters",
    "km": "kilometers",
    "cm": "centimeters",
    "mi": "miles",
    "ft": "feet",
    "in": "inches",
    "kg": "kilograms",
    "g": "grams",
    "lb": "pounds",
    "oz": "ounces",
    "l": "liters",
    "ml": "milliliters",
    "gal": "gallons",
    "c": "degrees Celsius",
    "f": "degrees Fahrenheit",
}
_CONVERSIONS = [
    ("km", "mi"),
    ("mi", "km"),
    ("m", "ft"),
    ("ft", "m"),
    ("cm", "in"),
    ("in", "cm"),
    ("kg", "lb"),
    ("lb", "kg"),
    ("g", "oz"),
    ("oz", "g"),
    ("l", "gal"),
    ("gal", "l"),
    ("ml", "l"),
    ("c", "f"),
    ("f", "c"),
]
_TOWN_QUESTIONS = {
    "population": "What is the population of {}?",
    "area_km2": "What is the area of {} in square kilometers?",
    "elevation_m": "What is the elevation of {} in meters?",
}
_PRODUCT_QUESTIONS = {
    "price_usd": "How much does {} cost in dollars?",
    "weight_kg": "How much does {} weigh in kilograms?",
}


def _arithmetic(rng: random.Random, gold: _Gold) -> str:
    a, b, c = rng.randint(13, 999), rng.randint(13, 99), rng.randint(2, 999)
    form = rng.randrange(4)
    if form == 0:
        prompt, expression = f"What is {a} times {b}, plus {c}?", f"{a} * {b} + {c}"
    elif form == 1:
        prompt, expression = f"What is {a} * {b} - {c}?", f"{a} * {b} - {c}"
    elif form == 2:
        prompt = f"What is the sum of {a} and {c}, multiplied by {b}?"
        expression = f"({a} + {c}) * {b}"
    else:
        prompt, expression = f"What is {a * b} divided by {b}, plus {c}?", f"{a * b} / {b} + {c}"
    gold.call("calculator", expression=expression)
    return prompt


def _convert(rng: random.Random, gold: _Gold) -> str:
    source, target = rng.choice(_CONVERSIONS)
    value = rng.randint(2, 500) if rng.random() < 0.7 else _number(str(rng.randint(20, 999) / 10))
    gold.call("convert", value=value, from_unit=source, to_unit=target)
    if source in ("c", "f"):
        return f"What is {value} {UNIT_NAMES[source]} in {UNIT_NAMES[target]}?"
    if rng.random() < 0.5:
        return f"How many {UNIT_NAMES[target]} are in {value} {UNIT_NAMES[source]}?"
    return f"Convert {value} {UNIT_NAMES[source]} to {UNIT_NAMES[target]}."


_LOOKUPS = [(town, field) for town in TOWNS for field in _TOWN_QUESTIONS] + [
    (product, field) for product in PRODUCTS for field in _PRODUCT_QUESTIONS
]


def _lookup(rng: random.Random, gold: _Gold) -> str:
    name, field = rng.choice(_LOOKUPS)
    gold.call("lookup", name=name, field=field)
    if name in TOWNS:
        return _TOWN_QUESTIONS[field].format(name)
    return _PRODUCT_QUESTIONS[field].format(_an(name))


def _lookup_calc(rng: random.Random, gold: _Gold) -> str:
    form = rng.randrange(3)
    if form == 2:
        town, n = rng.choice(sorted(TOWNS)), rng.randint(2, 99) * 50
        population = gold.call("lookup", name=town, field="population")
        gold.call("calculator", expression=f"{population} + {n}")
        return f"If {n} more people moved to {town}, what would its population be?"
    product, n = rng.choice(sorted(PRODUCTS)), rng.randint(2, 40)
    field = "price_usd" if form == 0 else "weight_kg"
    value = gold.call("lookup", name=product, field=field)
    gold.call("calculator", expression=f"{n} * {value}")
    if form == 0:
        return f"How much do {n} {product}s cost in total, in dollars?"
    return f"How much do {n} {product}s weigh in total, in kilograms?"


def _lookup_convert(rng: random.Random, gold: _Gold) -> str:
    if rng.random() < 0.5:
        town, unit = rng.choice(sorted(TOWNS)), rng.choice(["ft", "km", "mi"])
        meters = gold.call("lookup", name=town, field="elevation_m")
        gold.call("convert", value=_number(meters), from_unit="m", to_unit=unit)
        return f"What is the elevation of {town} in {UNIT_NAMES[unit]}?"
    product, unit = rng.choice(sorted(PRODUCTS)), rng.choice(["lb", "oz", "g"])
    kilograms = gold.call("lookup", name=product, field="weight_kg")
    gold.call("convert", value=_number(kilograms), from_unit="kg", to_unit=unit)
    return f"How much does {_an(product)} weigh in {UNIT_NAMES[unit]}?"


def _lookups_calc(rng: random.Random, gold: _Gold) -> str:
    form = rng.randrange(3)
    if form == 0:
        pair = rng.sample(sorted(TOWNS), 2)
        big, small = sorted(pair, key=lambda town: TOWNS[town]["population"], reverse=True)
        a = gold.call("lookup", name=big, field="population")
        b = gold.call("lookup", name=small, field="population")
        gold.call("calculator", expression=f"{a} - {b}")
        return f"How many more people live in {big} than in {small}?"
    if form == 1:
        first, second = rng.sample(sorted(PRODUCTS), 2)
        a = gold.call("lookup", name=first, field="price_usd")
        b = gold.call("lookup", name=second, field="price_usd")
        gold.call("calculator", expression=f"{a} + {b}")
        return f"How much do {_an(first)} and {_an(second)} cost together, in dollars?"
    town = rng.choice(sorted(TOWNS))
    people = gold.call("lookup", name=town, field="population")
    area = gold.call("lookup", name=town, field="area_km2")
    gold.call("calculator", expression=f"{people} / {area}")
    return f"How many people live in {town} per square kilometer?"


KINDS: dict[str, Callable[[random.Random, _Gold], str]] = {
    "arithmetic": _arithmetic,
    "convert": _convert,
    "lookup": _lookup,
    "lookup_calc": _lookup_calc,
    "lookup_convert": _lookup_convert,
    "lookups_calc": _lookups_calc,
}
KIND_ORDER = tuple(KINDS)


# ---- splits


def split_of(signature: str) -> str:
    """The split a task belongs to, by its gold calls (never by the seed or its phrasing)."""
    bucket = hashlib.sha256(signature.encode()).digest()[0]
    return "heldout" if bucket < HELDOUT_BUCKETS else "train"


def task_id(seed: int, split: str, index: int) -> str:
    return f"{FAMILY}-{seed}-{split}-{index:04d}"


def generate(seed: int, split: str) -> Iterator[ToolTask]:
    """The split's tasks in order, until a kind has no new task left (ValueError then, after
    SPLIT_SIZES[split] tasks); ValueError for a seed outside 0..MAX_SEED."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"the seed must be 0 to {MAX_SEED}, not {seed}")
    rng = random.Random(f"onthejob-tool-tasks-{seed}-{split}")
    seen: set[str] = set()
    for index in itertools.count():
        kind = KIND_ORDER[index % len(KIND_ORDER)]
        yield _draw(rng, kind, split, seen, task_id(seed, split, index))


def _draw(rng: random.Random, kind: str, split: str, seen: set[str], key: str) -> ToolTask:
    for _ in range(MAX_DRAWS):
        gold = _Gold()
        prompt = KINDS[kind](rng, gold)
        signature = gold.signature()
        if split_of(signature) != split or signature in seen:
            continue
        seen.add(signature)
        answer = gold.calls[-1]["result"]
        return ToolTask(key, prompt, answer, kind, split, tuple(gold.calls))
    raise ValueError(f"the {split} split has no new {kind} task left after {len(seen)} tasks")


def make_task_sets(
    seed: int, n_train: int, n_heldout: int
) -> tuple[list[ToolTask], list[ToolTask]]:
    """(train, held-out): the first n_train and n_heldout tasks of the seed's splits."""
    train = list(itertools.islice(generate(seed, "train"), n_train))
    heldout = list(itertools.islice(generate(seed, "heldout"), n_heldout))
    return train, heldout


class _Streams:
    """The tasks generated so far per (seed, split), for finding a task by its id: the
    `max_streams` used last are kept (any client may name any seed in its task key)."""

    def __init__(self, max_streams: int = MAX_STREAMS) -> None:
        self._lock = threading.Lock()
        self._max = max_streams
        self._made: OrderedDict[tuple[int, str], tuple[list[ToolTask], Iterator[ToolTask]]]
        self._made = OrderedDict()

    def __len__(self) -> int:
        return len(self._made)

    def task(self, seed: int, split: str, index: int) -> ToolTask:
        """The split's task `index`; ValueError past the split's end, however often asked."""
        with self._lock:
            made, stream = self._stream(seed, split)
            try:
                while len(made) <= index:
                    made.append(next(stream))
            except (StopIteration, ValueError) as exc:  # StopIteration: it ended before
                name = task_id(seed, split, index)
                message = f"no task {name}: the {split} split ends after {len(made)} tasks"
                raise ValueError(message) from exc
            return made[index]

    def _stream(self, seed: int, split: str) -> tuple[list[ToolTask], Iterator[ToolTask]]:
        key = (seed, split)
        if key not in self._made:
            self._made[key] = ([], generate(seed, split))
            while len(self._made) > self._max:
                self._made.popitem(last=False)
        self._made.move_to_end(key)
        return self._made[key]


_STREAMS = _Streams()
_KEY = re.compile(rf"{FAMILY}-(\d{{1,10}})-({'|'.join(SPLITS)})-(\d{{1,6}})", re.ASCII)


def task_by_key(key: str) -> ToolTask:
    """The task a `tools-<seed>-<split>-<index>` id names; ValueError for any other id, a
    seed above MAX_SEED or an index past its split's end (SPLIT_SIZES)."""
    match = _KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"{key!r:.80} is not a {FAMILY} task id ({FAMILY}-SEED-SPLIT-INDEX)")
    seed, split, index = int(match[1]), match[2], int(match[3])
    if seed > MAX_SEED:
        raise ValueError(f"{key!r}: the seed must be 0 to {MAX_SEED}")
    if index >= SPLIT_SIZES[split]:
        size = SPLIT_SIZES[split]
        raise ValueError(f"{key!r}: the {split} split has {size} tasks (index 0 to {size - 1})")
    return _STREAMS.task(seed, split, index)


# ---- files


def write_jsonl(tasks: Iterable[ToolTask], path: Path) -> Path:
    """The tasks one row a line (the task-set format); returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for task in tasks:
            out.write(json.dumps(task.row(), ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: Path) -> list[ToolTask]:
    """The tasks of a file `write_jsonl` wrote; ValueError for a line that is not one."""
    with open(path, encoding="utf-8") as lines:
        return [ToolTask.from_row(json.loads(line)) for line in lines if line.strip()]
