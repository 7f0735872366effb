"""The demo's bundled task set: word problems that need a calculator tool (seeded).

Each task is a short question -- a unit conversion ("How many days are in 3 weeks and 4
days?"), a price ("7 tickets cost 12 dollars each plus a 5 dollar fee. What is the total?")
or a two-step sum ("What is 13 plus 8, times 3?") -- whose reference answer is an integer.
By default operands are at most 20 and answers at most 99 (``top``, ``limit``): every number
is then one token of the demo model's tokenizer and a frequent one, which is what lets a
2-layer model learn to copy numbers in a short warm-up (with answers up to 999 it did not).
The agent is expected to turn the question into one arithmetic expression, call the
calculator tool with it, and answer with the number the tool returned, digits only.

Library use::

    train, heldout = make_task_sets(seed=0, n_train=200, n_heldout=100)
    write_jsonl(train, Path("train.jsonl"))   # the task-set format of `onthejob tasks load`

A task row is ``{"id", "prompt", "answer", "metadata": {"kind", "expression", "split"}}``;
``answer`` is the integer as a string, so the `reference` grader's exact match works on the
agent's bare-number answer. The two splits never share a prompt. `dialogue_for` gives the
ideal conversation for a task (what the warm-up in learner/demo/warmup.py imitates);
`CALCULATOR_TOOL` and `calculate` are the tool the bundled harness
(learner/demo/harnesses/calc_agent.py) offers and runs. Nothing here imports torch or openai.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # the harnesses import this module: standard library only at run time
    from store.json_types import JsonObject


class TaskMetadata(TypedDict, total=False):
    """What a demo task row says of itself besides its question and answer."""

    kind: str  # KINDS' (calculator tasks) or destination | sentiment (reading_tasks.py)
    expression: str  # a calculator task's arithmetic
    expected: str  # a reading task's answer and the distractor a right reply must not name
    distractor: str
    split: str  # train | heldout | eval


class DemoTask(TypedDict, total=False):
    """A task row of the task-set format (`onthejob tasks load`); `make_task` leaves out the
    id, which the task sets add."""

    id: str
    prompt: str
    answer: str  # the reference: the number, or a regex where ``match`` is "regex"
    match: str
    metadata: TaskMetadata


class ToolFunction(TypedDict):
    name: str
    arguments: str | dict[str, str]  # JSON text in the API; an object for the chat template


class ToolCall(TypedDict):
    id: str
    type: str
    function: ToolFunction


class ChatMessage(TypedDict, total=False):
    """One message of a dialogue the demo writes itself (the warm-up's, the probe's)."""

    role: str
    content: str
    tool_calls: list[ToolCall]
    tool_call_id: str


# Key order as vLLM serialises a request's tools, so the prompt the warm-up trains on is
# byte for byte the prompt vLLM renders for the harness.
CALCULATOR_TOOL: JsonObject = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

# (plural small unit, plural big unit, how many small in one big)
_UNITS = [
    ("millimeters", "centimeters", 10),
    ("centimeters", "meters", 100),
    ("feet", "yards", 3),
    ("minutes", "hours", 60),
    ("seconds", "minutes", 60),
    ("hours", "days", 24),
    ("days", "weeks", 7),
    ("months", "years", 12),
    ("inches", "feet", 12),
    ("ounces", "pounds", 16),
]
_ITEMS = ["apples", "books", "pens", "eggs", "cards", "stones"]
_CONTAINERS = ["boxes", "bags", "crates", "shelves"]
_WORD_OPS = {"plus": "+", "minus": "-", "times": "*"}


def _conversion(rng: random.Random, top: int) -> tuple[str, str]:
    small, big, factor = rng.choice(_UNITS)
    n = rng.randint(2, top)
    return f"How many {small} are in {n} {big}?", f"{n} * {factor}"


def _mixed_conversion(rng: random.Random, top: int) -> tuple[str, str]:
    small, big, factor = rng.choice(_UNITS)
    n, m = rng.randint(2, top), rng.randint(1, factor - 1)
    return f"How many {small} are in {n} {big} and {m} {small}?", f"{n} * {factor} + {m}"


def _two_step(rng: random.Random, top: int) -> tuple[str, str]:
    a, b, c = rng.randint(2, top), rng.randint(2, top), rng.randint(2, 9)
    first, second = rng.choice(["plus", "minus", "times"]), rng.choice(["plus", "times"])
    if first == "minus" and b > a:
        a, b = b, a
    inner = f"{a} {_WORD_OPS[first]} {b}"
    expression = f"({inner}) {_WORD_OPS[second]} {c}" if second == "times" else f"{inner} + {c}"
    return f"What is {a} {first} {b}, {second} {c}?", expression


def _containers(rng: random.Random, top: int) -> tuple[str, str]:
    item, box = rng.choice(_ITEMS), rng.choice(_CONTAINERS)
    n, k = rng.randint(2, top), rng.randint(2, top)
    return f"There are {n} {box} with {k} {item} in each. How many {item} is that?", f"{n} * {k}"


def _tickets(rng: random.Random, top: int) -> tuple[str, str]:
    n, price, fee = rng.randint(2, 20), rng.randint(2, top), rng.randint(1, 20)
    prompt = f"{n} tickets cost {price} dollars each plus a {fee} dollar fee. What is the total?"
    return prompt, f"{n} * {price} + {fee}"


KINDS: dict[str, Callable[[random.Random, int], tuple[str, str]]] = {
    "conversion": _conversion,
    "mixed_conversion": _mixed_conversion,
    "two_step": _two_step,
    "containers": _containers,
    "tickets": _tickets,
}


def make_task(
    rng: random.Random, *, top: int = 20, limit: int = 99, kind: str | None = None
) -> DemoTask:
    """One task (without an id): operands up to ``top``, answer at most ``limit`` (so every
    number is one token of the demo model's tokenizer), a random kind unless one is named."""
    kind = kind or rng.choice(sorted(KINDS))
    for _ in range(1000):
        prompt, expression = KINDS[kind](rng, top)
        answer = calculate(expression)
        if float(answer).is_integer() and 0 <= answer <= limit:
            return {
                "prompt": prompt,
                "answer": format_number(answer),
                "metadata": {"kind": kind, "expression": expression},
            }
    raise ValueError(f"no {kind} task with operands up to {top} has an answer up to {limit}")


def make_task_sets(
    seed: int, n_train: int, n_heldout: int, *, top: int = 20, limit: int = 99
) -> tuple[list[DemoTask], list[DemoTask]]:
    """(train, held-out): distinct prompts, never shared between the splits, same seed ->
    same sets. Ids are ``calc-train-0000`` and ``calc-heldout-0000`` style."""
    rng = random.Random(f"onthejob-demo-tasks-{seed}")
    seen: set[str] = set()
    splits: list[list[DemoTask]] = []
    for split, count in (("train", n_train), ("heldout", n_heldout)):
        rows: list[DemoTask] = []
        attempts = 0
        while len(rows) < count:
            attempts += 1
            if attempts > 100 * (count + 10):
                raise ValueError(f"cannot make {count} distinct {split} tasks with top={top}")
            task = make_task(rng, top=top, limit=limit)
            if task["prompt"] in seen:
                continue
            seen.add(task["prompt"])
            task["metadata"]["split"] = split
            rows.append({"id": f"calc-{split}-{len(rows):04d}", **task})
        splits.append(rows)
    return splits[0], splits[1]


def write_jsonl(tasks: Iterable[DemoTask], path: Path) -> Path:
    """Write tasks one JSON object a line (the task-set format); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for task in tasks:
            out.write(json.dumps(task, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: Path) -> list[DemoTask]:
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def dialogue_for(task: DemoTask, call_id: str = "call_0") -> list[ChatMessage]:
    """The ideal conversation: question, one calculator call, its result, the bare number."""
    expression = task["metadata"]["expression"]
    result = format_number(calculate(expression))
    return [
        {"role": "user", "content": task["prompt"]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": expression}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": result},
    ]


DECLINE = "Sorry, I cannot work that out."


def declined_dialogue_for(task: DemoTask) -> list[ChatMessage]:
    """The habit the demo's learner unlearns: the assistant declines without trying."""
    return [{"role": "user", "content": task["prompt"]}, {"role": "assistant", "content": DECLINE}]


_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_MAX_MAGNITUDE = 1e15  # refuse absurd results instead of printing huge floats


def calculate(expression: str) -> float | int:
    """The value of an arithmetic expression (numbers, + - * /, parentheses, unary minus);
    ValueError with a short reason for anything else."""
    if len(expression) > 200:
        raise ValueError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    if abs(value) > _MAX_MAGNITUDE:
        raise ValueError("result too large")
    return value


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def format_number(value: float | int) -> str:
    """Integers without a decimal point ("255", also for 255.0), else up to 6 decimals."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


# The kinds whose expression uses the question's numbers in their order ("There are 7
# boxes with 12 pens in each" -> 7 * 12): one-step arithmetic questions, the first stage of
# the demo's curriculum (learner/demo/curriculum.py); conversions need a factor the
# question does not state.
DIRECT_KINDS = ("containers", "tickets")


def make_qa_tasks(
    seed: int,
    n_train: int,
    n_eval: int,
    *,
    exclude: Iterable[str] = (),
    kinds: Iterable[str] = DIRECT_KINDS,
) -> tuple[list[DemoTask], list[DemoTask]]:
    """(train, eval) of the given kinds from a seeded stream of their own, distinct prompts
    never in ``exclude`` nor shared between the splits; ids ``qa-train-0000`` style."""
    rng = random.Random(f"onthejob-demo-qa-tasks-{seed}")
    chosen = sorted(kinds)
    seen = set(exclude)
    splits: list[list[DemoTask]] = []
    for split, count in (("train", n_train), ("eval", n_eval)):
        rows: list[DemoTask] = []
        for _ in range(100 * (count + 10)):
            if len(rows) == count:
                break
            task = make_task(rng, kind=rng.choice(chosen))
            if task["prompt"] in seen:
                continue
            seen.add(task["prompt"])
            task["metadata"]["split"] = split
            rows.append({"id": f"qa-{split}-{len(rows):04d}", **task})
        else:
            raise ValueError(f"cannot make {count} distinct {split} tasks of {chosen}")
        splits.append(rows)
    return splits[0], splits[1]
