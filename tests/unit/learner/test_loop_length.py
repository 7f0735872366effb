"""The learner's loop reads in short functions (issue 43): none in learner/loop/ is longer
than 60 lines, so one iteration can be followed top to bottom."""

from __future__ import annotations

import ast
from pathlib import Path

LOOP = Path(__file__).resolve().parents[3] / "learner" / "loop"
LONGEST = 60


def long_functions(source: str, limit: int = LONGEST) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than `limit` lines."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_the_checker_measures_a_function_from_its_def_to_its_last_line() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    assert long_functions("def f():\n" + body) == [("f", 61)]
    assert long_functions("def f():\n" + body[: body.rindex("    x59")]) == []


def test_no_function_in_the_loop_is_longer_than_60_lines() -> None:
    found = {
        f"{path.name}:{name}": lines
        for path in sorted(LOOP.glob("*.py"))
        for name, lines in long_functions(path.read_text())
    }
    assert found == {}, found
