"""The tests mirror the code in three tiers, share helpers only through tests/support/, and
use neither the benches nor the demo as a library: what a test shares with them lives in the
product, which they all import."""

from __future__ import annotations

import ast
import re
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
    in the product (learner/vllm_server.py, learner/toys/, ...), and both import it there."""
    bench = TESTS.parent / "bench"
    offenders = {
        str(path.relative_to(bench)): sorted(
            n for n in imported_modules(path) if n == "tests" or n.startswith("tests.")
        )
        for path in bench.rglob("*.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"move what they share into the product: {offenders}"


# a module named in a string: a grader (python:MODULE:FUNCTION), `python -m MODULE`
NAMED_MODULE = re.compile(r"(?:python:)?([a-z_]\w*(?:\.\w+)+)(?::\w+)?")


def of_the_benches(path: Path) -> bool:
    """A test of a bench: it mirrors bench/ or is named for one (test_bench_*.py,
    test_*_bench.py)."""
    return path.is_relative_to(TESTS / "unit" / "bench") or "bench" in path.stem


def of_the_demo(path: Path) -> bool:
    """A test of `onthejob demo`: it mirrors learner/demo/ or is named for it (test_demo*.py)."""
    return path.is_relative_to(TESTS / "unit" / "learner" / "demo") or path.stem.startswith(
        "test_demo"
    )


# who may import each: its own tests; the demo's also the benches' tests, as the benches
# measure the demo and their tests check how they drive it
MAY_IMPORT = {
    "bench": (of_the_benches,),
    "learner.demo": (of_the_demo, of_the_benches),
}


def named_modules(path: Path) -> set[str]:
    found = imported_modules(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if match := NAMED_MODULE.fullmatch(node.value):
                found.add(match.group(1))
    return found


def test_the_tests_use_neither_the_benches_nor_the_demo_as_a_library() -> None:
    """A toy task, the vLLM launcher, a fake upstream: what a test needs of them lives in the
    product or tests/support/, so that a bench or the demo changes without breaking a test
    of something else. Only their own tests import them (by an import, a python: grader or
    `python -m`)."""
    offenders = {}
    for path in TESTS.rglob("*.py"):
        if path == Path(__file__).resolve():
            continue  # it names them
        wrong = {
            name
            for name in named_modules(path)
            for package, allowed in MAY_IMPORT.items()
            if (name == package or name.startswith(package + "."))
            and not any(may(path) for may in allowed)
        }
        if wrong:
            offenders[str(path.relative_to(TESTS))] = sorted(wrong)
    assert not offenders, f"import what they share from the product instead: {offenders}"


def test_a_grader_or_a_module_run_by_name_counts_as_an_import(tmp_path: Path) -> None:
    module = tmp_path / "test_uses_a_bench.py"
    module.write_text(
        'GRADER = "python:bench.toy:reward"\n'
        'COMMAND = ["python", "-m", "learner.demo.harnesses.calc_agent"]\n'
        "from learner import demo\n"
    )
    assert named_modules(module) >= {
        "bench.toy",
        "learner.demo.harnesses.calc_agent",
        "learner.demo",
    }


def misplaced_unit_tests(tests: Path, product: Path) -> dict[str, str]:
    """Unit test modules named after one product module (test_X.py for X.py or the package X)
    that sit elsewhere than that module's mirror under tests/unit: {test: where it belongs}.
    A name that several modules of the package share is left alone (the test says which)."""
    misplaced = {}
    for test in sorted((tests / "unit").rglob("test_*.py")):
        mirror = test.parent.relative_to(tests / "unit")
        if not mirror.parts:
            continue  # the repo-wide rules sit at the top
        stem = test.stem.removeprefix("test_")
        package = product / mirror.parts[0]
        homes = {
            path.parent.relative_to(product)
            for path in [*package.rglob(f"{stem}.py"), *package.rglob(f"{stem}/__init__.py")]
        }
        if len(homes) == 1 and mirror not in homes:
            misplaced[str(test.relative_to(tests))] = f"tests/unit/{homes.pop()}/"
    return misplaced


def test_unit_tests_mirror_the_packages() -> None:
    misplaced = misplaced_unit_tests(TESTS, TESTS.parent)
    assert not misplaced, f"move each unit test beside its module's mirror: {misplaced}"


def test_a_unit_test_away_from_its_module_s_mirror_is_found(tmp_path: Path) -> None:
    (tmp_path / "proxy" / "recording").mkdir(parents=True)
    (tmp_path / "proxy" / "recording" / "spool.py").write_text("")
    (tmp_path / "tests" / "unit" / "proxy" / "recording").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "proxy" / "test_spool.py").write_text("")
    (tmp_path / "tests" / "unit" / "proxy" / "recording" / "test_other.py").write_text("")
    found = misplaced_unit_tests(tmp_path / "tests", tmp_path)
    assert found == {"unit/proxy/test_spool.py": "tests/unit/proxy/recording/"}
