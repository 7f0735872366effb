"""The layering `make lint` enforces (pyproject's [tool.importlinter]): proxy and learner
meet only in store/, which imports neither. Checked on the code as it is, and on a copy
with one wrong-way import added, which must break the contract that forbids it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "learner", "store", "migrations")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("static"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_code_keeps_its_layers() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_a_store_module_importing_the_learner_breaks_the_store_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    clock = root / "store" / "clock.py"
    clock.write_text(clock.read_text() + "\nfrom learner import loop  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "the store imports neither the proxy nor the learner BROKEN" in result.stdout
    assert "store.clock -> learner.loop" in result.stdout


def test_the_proxy_importing_the_learner_breaks_the_independence_contract(
    tmp_path: Path,
) -> None:
    root = _copy(tmp_path)
    metrics = root / "proxy" / "metrics.py"
    metrics.write_text(metrics.read_text() + "\nfrom learner import grading  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "the proxy and the learner do not import each other BROKEN" in result.stdout
    assert "proxy.metrics -> learner.grading" in result.stdout
