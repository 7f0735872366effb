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


# tests/unit's own top level: the repo-wide rules, each about no one module
REPO_WIDE = {
    "test_docs_paragraphs.py",
    "test_environment_reads.py",
    "test_layering.py",
    "test_layout.py",
    "test_open_dicts.py",
    "test_reference_docs.py",
}
PACKAGES = ("cli", "proxy", "learner", "store", "migrations", "bench")


def module_homes(modules: list[Path], stem: str) -> set[Path]:
    """Where a test named test_<stem>.py may sit, relative to tests/unit, given the
    product's modules (relative paths): beside the modules named <stem> (test_main also for
    __main__), and for a package named so, inside it too."""
    homes: set[Path] = set()
    for path in modules:
        if path.stem in (stem, f"__{stem}__"):
            homes.add(path.parent)
        if path.name == "__init__.py" and path.parent.name == stem:
            homes.update({path.parent, path.parent.parent})
    return homes


def misplaced_unit_tests(tests: Path, product: Path) -> dict[str, str]:
    """Unit test modules named after product modules (test_X.py for X.py, or the package X)
    that sit beside none of them, under tests/unit's mirror of the product: {test: where
    it may go}. A test named after no module is left alone (it says what it tests)."""
    modules = [
        path.relative_to(product)
        for package in PACKAGES
        for path in (product / package).rglob("*.py")
    ]
    misplaced = {}
    for test in sorted((tests / "unit").rglob("test_*.py")):
        mirror = test.parent.relative_to(tests / "unit")
        if not mirror.parts:
            if test.name not in REPO_WIDE:
                misplaced[str(test.relative_to(tests))] = "beside the module it tests"
            continue
        homes = module_homes(modules, test.stem.removeprefix("test_"))
        if homes and mirror not in homes:
            where = " or ".join(f"tests/unit/{home}/" for home in sorted(homes))
            misplaced[str(test.relative_to(tests))] = where
    return misplaced


def test_unit_tests_mirror_the_packages() -> None:
    misplaced = misplaced_unit_tests(TESTS, TESTS.parent)
    assert not misplaced, f"move each unit test beside its module's mirror: {misplaced}"


def test_a_unit_test_away_from_its_module_s_mirror_is_found(tmp_path: Path) -> None:
    for module in ("proxy/recording/spool.py", "proxy/base/keys.py", "proxy/admin/keys.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    unit = tmp_path / "tests" / "unit"
    for test in ("proxy/test_spool.py", "proxy/test_keys.py", "proxy/recording/test_other.py",
                 "proxy/base/test_keys.py", "test_spool.py", "test_layout.py"):  # fmt: skip
        (unit / test).parent.mkdir(parents=True, exist_ok=True)
        (unit / test).write_text("")
    assert misplaced_unit_tests(tmp_path / "tests", tmp_path) == {
        "unit/proxy/test_spool.py": "tests/unit/proxy/recording/",
        "unit/proxy/test_keys.py": "tests/unit/proxy/admin/ or tests/unit/proxy/base/",
        "unit/test_spool.py": "beside the module it tests",
    }
