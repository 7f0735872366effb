"""The tests mirror the code in three tiers, and share helpers only through tests/support/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_test_module_imports_another_or_the_conftest() -> None:
    offenders = {}
    for path in TESTS.rglob("*.py"):
        wrong = {
            name
            for name in imported_modules(path)
            if name.startswith("tests.")
            and (name.split(".")[-1].startswith("test_") or name.startswith("tests.conftest"))
        }
        if wrong:
            offenders[str(path.relative_to(TESTS))] = sorted(wrong)
    assert not offenders, f"move what they share into tests/support/: {offenders}"


def test_every_test_module_is_in_a_tier() -> None:
    stray = [
        str(p.relative_to(TESTS))
        for p in TESTS.rglob("test_*.py")
        if p.relative_to(TESTS).parts[0] not in TIERS
    ]
    assert not stray, f"put these under tests/unit, tests/integration or tests/e2e: {stray}"


def test_bench_does_not_import_the_tests() -> None:
    """Benchmarks are tools a user runs from a clone: what they share with the tests lives
    in bench/ or the product, and the tests import it from there."""
    bench = TESTS.parent / "bench"
    offenders = {
        str(path.relative_to(bench)): sorted(
            n for n in imported_modules(path) if n == "tests" or n.startswith("tests.")
        )
        for path in bench.rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"move what they share into bench/: {offenders}"
