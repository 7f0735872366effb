"""Typed data in the product (issue 43 step 5): a trajectory, a row, a request's known shape
have TypedDicts or dataclasses, open JSON is store/json_types.py's `JsonObject`. What is
left as a mapping of anything (`dict[str, Any]`, and its stand-ins `Dict`, `Mapping`,
`MutableMapping` and `dict[str, object]`) is counted here and may not grow: the limit is
the count when the step landed (766 before it). Lower it when you type one more."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("cli", "proxy", "learner", "store")
LIMIT = 21
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping"}
ANYTHING = {"Any", "object"}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Any, collections.abc.Mapping
        return node.attr
    return None


def open_mappings(source: str) -> list[int]:
    """Lines of each mapping from strings to anything, in annotations or aliases alike
    (a string annotation is parsed too)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                inner = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            lines += [node.lineno for _ in open_mappings_in(inner)]
        elif _is_open_mapping(node):
            lines.append(node.lineno)
    return lines


def open_mappings_in(tree: ast.AST) -> list[ast.AST]:
    return [node for node in ast.walk(tree) if _is_open_mapping(node)]


def _is_open_mapping(node: ast.AST) -> bool:
    if not isinstance(node, ast.Subscript) or _name(node.value) not in MAPPINGS:
        return False
    args = node.slice
    return isinstance(args, ast.Tuple) and len(args.elts) == 2 and _name(args.elts[1]) in ANYTHING


def test_the_counter_finds_every_spelling() -> None:
    source = (
        "from typing import Any\n"
        "a: dict[str, Any] = {}\n"
        "b: 'Mapping[str, object]'\n"
        "def f(x: typing.Dict[str, typing.Any]) -> None: ...\n"
        "Alias = dict[str, Any]\n"
        "c: dict[str, int] = {}\n"
        "d: list[Any] = []\n"
    )
    assert sorted(open_mappings(source)) == [2, 3, 4, 5]


def test_open_mappings_in_the_product_do_not_grow() -> None:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            found += [f"{name}:{line}" for line in open_mappings(path.read_text())]
    assert len(found) <= LIMIT, (
        f"{len(found)} mappings of anything (limit {LIMIT}): type the new ones "
        "(a TypedDict, a dataclass, or store/json_types.JsonObject for open JSON)\n"
        + "\n".join(found)
    )
