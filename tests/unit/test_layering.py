"""The layering `make lint` enforces (pyproject's [tool.importlinter]): the command line
(cli/) above proxy and learner, which meet only in store/, which imports neither; inside the
proxy, layers from the client APIs down to proxy.base, and no import cycles; inside the
learner's loop, the orchestrator over its parts, each part over those it calls. Checked on the
code as it is, and on a copy with one wrong-way import added, which must break the contract
that forbids it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "proxy", "learner", "store", "migrations")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
RUFF = Path(sys.executable).with_name("ruff")


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
    assert "6 kept, 0 broken" in result.stdout


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


def test_the_base_layer_importing_a_client_api_breaks_the_layers_contract(
    tmp_path: Path,
) -> None:
    root = _copy(tmp_path)
    errors = root / "proxy" / "base" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom proxy.api import dialect  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "the proxy's layers BROKEN" in result.stdout
    assert "proxy.base.errors -> proxy.api.dialect" in result.stdout


def test_a_recording_module_importing_its_importer_breaks_the_acyclic_contract(
    tmp_path: Path,
) -> None:
    # rows is imported by the recorder (through the writer too): rows importing the
    # recorder is the cycle the call's record once made
    root = _copy(tmp_path)
    rows = root / "proxy" / "recording" / "rows.py"
    rows.write_text(rows.read_text() + "\nfrom proxy.recording import recorder  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "no import cycles among the proxy's packages and modules BROKEN" in result.stdout
    assert "- .rows -> .recorder" in result.stdout


def _ruff(root: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUFF), "check", "--no-cache", "--select", "TID251", *paths],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_sql_is_written_in_the_store_alone(tmp_path: Path) -> None:
    assert _ruff(ROOT, "proxy", "learner", "store").returncode == 0
    root = _copy(tmp_path)
    query = "from sqlalchemy import func, select  # noqa: F401\n"
    for module in ("proxy/admin/routes/tasks.py", "learner/loop/step.py", "store/tasks.py"):
        path = root / module
        path.write_text(path.read_text() + query)
    result = _ruff(root, "proxy", "learner", "store")
    assert result.returncode == 1
    assert "`sqlalchemy.select` is banned" in result.stdout
    flagged = {line.split(":")[0].strip("-> ") for line in result.stdout.splitlines()
               if line.lstrip().startswith("-->")}  # fmt: skip
    assert flagged == {"proxy/admin/routes/tasks.py", "learner/loop/step.py"}, result.stdout


def test_the_learner_importing_the_command_line_breaks_its_layers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    config = root / "learner" / "config.py"
    config.write_text(config.read_text() + "\nfrom cli import main  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "the command line above the proxy and the learner, the store below them BROKEN" in (
        result.stdout
    )
    assert "learner.config -> cli.main" in result.stdout


def test_a_part_of_the_loop_importing_its_caller_breaks_the_loops_layers(tmp_path: Path) -> None:
    # the weights are held by the step, never the other way round
    root = _copy(tmp_path)
    weights = root / "learner" / "loop" / "weights.py"
    weights.write_text(weights.read_text() + "\nfrom learner.loop import step  # noqa\n")
    result = _lint_imports(root)
    assert result.returncode == 1
    assert "the learner's loop: the orchestrator over its parts" in result.stdout
    assert "learner.loop.weights -> learner.loop.step" in result.stdout
