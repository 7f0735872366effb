"""One configuration system: the settings are the source, the flags are generated from them,
and the reference pages (docs/reference/) must say what the code does (`make docs`)."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from cli.main import build_parser
from learner.command_settings import (
    ModelPrepareSettings,
    ModelsSettings,
    PinSettings,
    RegradeSettings,
    RollbackSettings,
)
from learner.config import LearnerConfig
from learner.rollout.settings import RolloutSettings
from proxy.command_settings import ExportSettings, SpoolReplaySettings
from proxy.settings import Settings
from store.settings_fields import argument_name
from tests.support.flags import check_flags, flags_from, flags_of

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "docs" / "reference" / "generate.py"
FIX = "run `make docs` and commit docs/reference/"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return {name: sub for name, sub in generator()._subcommands(parser)}


def test_the_configuration_page_is_the_one_the_settings_generate() -> None:
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert page == generator().configuration_page(), FIX


def test_the_cli_page_has_every_command_with_exactly_its_flags() -> None:
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    sections = dict(re.findall(r"\n## onthejob ([a-z -]+)\n\n```\n(.*?)\n```", page, re.S))
    leaves = {
        name: sub
        for name, sub in commands().items()
        if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
    }
    assert set(sections) == set(leaves), FIX
    for name, sub in leaves.items():
        shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", sections[name])) - {"--help"}
        assert shown >= flags_of(sub), f"`{name}`: {sorted(flags_of(sub) - shown)}; {FIX}"


@pytest.mark.parametrize(
    ("command", "settings", "extra"),
    [
        ("serve", Settings, set()),
        ("learn", LearnerConfig, {"--config"}),
        ("rollout", RolloutSettings, set()),
        ("export", ExportSettings, set()),
        ("spool replay", SpoolReplaySettings, set()),
        ("models prepare", ModelPrepareSettings, set()),
        ("models list", ModelsSettings, set()),
    ],
)
def test_every_setting_has_its_flag_and_every_flag_is_a_setting(
    command: str, settings: type, extra: set[str]
) -> None:
    """`onthejob demo`'s: tests/unit/learner/demo/test_demo_model_choice.py."""
    check_flags(commands()[command], settings, extra)


LEARNER_DB = {"database_url"}
REGRADE_LEARNER = {
    "database_url",
    "migrate",
    "upstreams",
    "graders",
    "tasks",
    "self_judge",
    "rubrics",
}


@pytest.mark.parametrize(
    ("command", "settings", "learner_settings", "extra"),
    [
        ("rollback", RollbackSettings, {"database_url", "upstreams"}, set()),
        ("pin", PinSettings, LEARNER_DB, set()),
        ("unpin", PinSettings, LEARNER_DB, set()),
        ("regrade", RegradeSettings, REGRADE_LEARNER, {"--config"}),
    ],
)
def test_the_learners_smaller_commands_take_their_settings_and_some_of_the_learners(
    command: str, settings: type, learner_settings: set[str], extra: set[str]
) -> None:
    parser = commands()[command]
    expected = flags_from(settings) | flags_from(LearnerConfig, only=learner_settings)
    assert flags_of(parser) == expected | extra
    arguments = {a.metavar for a in parser._actions if not a.option_strings}
    assert arguments == {argument_name(n, i) for n, i in settings.model_fields.items()} - {None}


def test_flags_beat_the_environment_which_beats_the_toml_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LEARNING_RATE", "MAX_STALENESS", "GRADERS", "LORA"):
        monkeypatch.delenv(f"ONTHEJOB_LEARN_{name}", raising=False)
    file = tmp_path / "learner.toml"
    file.write_text(
        'learning_rate = 3e-4\nmax_staleness = 2\ngraders = ["feedback", "reference"]\n'
        "lora = true\n"
    )
    loaded = LearnerConfig.load(config_file=file, overrides={"model": "m"})
    assert (loaded.learning_rate, loaded.max_staleness) == (3e-4, 2)
    assert loaded.graders == ["feedback", "reference"] and loaded.lora is True
    monkeypatch.setenv("ONTHEJOB_LEARN_MAX_STALENESS", "7")
    monkeypatch.setenv("ONTHEJOB_LEARN_GRADERS", "judge,feedback")
    args = build_parser().parse_args(
        ["learn", "--config", str(file), "--model", "m", "--learning-rate", "1e-3", "--no-lora"]
    )
    from cli.learn import learner_config

    config = learner_config(args)
    assert config.learning_rate == 1e-3 and config.lora is False  # the flags
    assert config.max_staleness == 7 and config.graders == ["judge", "feedback"]  # the env


def test_a_wrong_setting_is_refused_with_its_name(tmp_path: Path) -> None:
    file = tmp_path / "learner.toml"
    file.write_text("learning_rat = 3e-4\n")
    with pytest.raises(ValueError, match=r"unknown setting learning_rat in .*learner\.toml"):
        LearnerConfig.load(config_file=file, overrides={"model": "m"})
    with pytest.raises(ValueError, match="no such file"):
        LearnerConfig.load(config_file=tmp_path / "missing.toml", overrides={"model": "m"})
    with pytest.raises(ValueError, match="type_baseline"):
        LearnerConfig.load(config_file=None, overrides={"model": "m", "type_baseline": "mean"})
    with pytest.raises(SystemExit):  # argparse knows the choices too
        build_parser().parse_args(["learn", "--type-baseline", "mean"])


def test_the_database_url_comes_from_the_flag_then_either_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ONTHEJOB_LEARN_DATABASE_URL", raising=False)
    monkeypatch.delenv("ONTHEJOB_DATABASE_URL", raising=False)
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).database_url == (
        "sqlite:///onthejob.db"
    )
    monkeypatch.setenv("ONTHEJOB_DATABASE_URL", "sqlite:///shared.db")
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).database_url == (
        "sqlite:///shared.db"
    )
    monkeypatch.setenv("ONTHEJOB_LEARN_DATABASE_URL", "sqlite:///learner.db")
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).database_url == (
        "sqlite:///learner.db"
    )
    args = build_parser().parse_args(["learn", "--model", "m", "--db", "sqlite:///flag.db"])
    from cli.learn import learner_config

    assert learner_config(args).database_url == "sqlite:///flag.db"


# Arguments written by hand, each for a reason; every other flag and argument of a command is
# generated from a settings field (cli/flags.py is the generator)
HAND_WRITTEN_ARGUMENTS = {
    "cli/main.py": 1,  # --log-level: `onthejob`'s own, before any command
    "cli/flags.py": 2,  # the generator
    "cli/rollout.py": 1,  # `-- COMMAND ARGS`: the harness rollout runs, as typed
}
# programs of their own that rollouts and the demo run as harnesses, not onthejob commands
HARNESS_PROGRAMS = ("learner/demo/harnesses/", "learner/rollout/tool_tasks/")


def hand_written_arguments(root: Path) -> dict[str, int]:
    """`add_argument` calls in the product's modules, by file (harness programs aside)."""
    found: dict[str, int] = {}
    for package in ("cli", "proxy", "learner", "store"):
        for path in sorted((root / package).rglob("*.py")):
            name = str(path.relative_to(root))
            if name.startswith(HARNESS_PROGRAMS):
                continue
            calls = len(re.findall(r"\.add_argument\(", path.read_text()))
            if calls:
                found[name] = calls
    return found


def test_every_command_s_flags_come_from_settings() -> None:
    found = hand_written_arguments(ROOT)
    assert found == HAND_WRITTEN_ARGUMENTS, (
        "declare the flag as a settings field (store/settings_fields.py `setting`) and add it "
        f"with add_flags; hand-written now: {found}"
    )


def test_a_hand_written_flag_is_found(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "cmd.py").write_text('parser.add_argument("--x")\n')
    (tmp_path / "learner" / "demo" / "harnesses").mkdir(parents=True)
    (tmp_path / "learner" / "demo" / "harnesses" / "a.py").write_text("p.add_argument('y')\n")
    assert hand_written_arguments(tmp_path) == {"proxy/cmd.py": 1}
