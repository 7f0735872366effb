"""`onthejob rollback`, `pin`, `regrade` and `models`: their flags and arguments come from
learner/command_settings.py (and ONTHEJOB_<COMMAND>_*), and the command lines people type
still parse as they did."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.flags import settings_from
from cli.main import build_parser
from learner.command_settings import (
    ModelPrepareSettings,
    ModelsSettings,
    PinSettings,
    RegradeSettings,
    RollbackSettings,
)


def test_rollback_and_pin_take_the_version_as_an_argument() -> None:
    args = build_parser().parse_args(["rollback", "step-3", "--db", "sqlite:///x.db"])
    assert settings_from(args, RollbackSettings, command="rollback").version == "step-3"
    assert args.database_url == "sqlite:///x.db"
    for command in ("pin", "unpin"):
        args = build_parser().parse_args([command, "step-4"])
        assert settings_from(args, PinSettings, command=command).version == "step-4"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollback"])


def test_the_regrade_filters_come_from_flags_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONTHEJOB_REGRADE_SESSION", "from-env")
    monkeypatch.setenv("ONTHEJOB_REGRADE_TRAJECTORY", "t1,t2")
    args = build_parser().parse_args(["regrade", "--failed", "--task", "k", "--since", "2026-01"])
    got = settings_from(args, RegradeSettings, command="regrade")
    assert (got.failed, got.session, got.task, got.since) == (True, "from-env", "k", "2026-01")
    assert got.trajectory == ["t1", "t2"]
    args = build_parser().parse_args(
        ["regrade", "--session", "s", "--trajectory", "a", "--trajectory", "b", "--no-failed"]
    )
    got = settings_from(args, RegradeSettings, command="regrade")
    assert (got.failed, got.session, got.trajectory) == (False, "s", ["a", "b"])


def test_models_prepare_takes_a_known_name_and_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["models", "prepare", "smollm2-135m", "--cache", "c"])
    got = settings_from(args, ModelPrepareSettings, command="models prepare")
    assert (got.name, got.cache) == ("smollm2-135m", Path("c"))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["models", "prepare", "no-such-model"])
    monkeypatch.setenv("ONTHEJOB_MODEL_CACHE", "/models")
    args = build_parser().parse_args(["models", "list"])
    assert settings_from(args, ModelsSettings, command="models list").cache == Path("/models")
