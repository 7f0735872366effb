"""Flags generated from settings fields: a positional field is an argument, a short alias
names the same flag, the environment fills in what no flag typed, and a refused value stops
the command with its name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from cli.flags import add_flags, settings_from
from store.settings_fields import argument_name, flag_name, setting


class Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONTHEJOB_EXAMPLE_", extra="forbid")

    version: str = setting(help="which one", positional=True, metavar="VERSION")
    output: Path | None = setting(None, "where", short="-o", metavar="FILE")
    count: int = setting(3, "how many")


def parse(*argv: str, settings: type[BaseSettings] = Example) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="onthejob example")
    add_flags(parser, settings)
    return parser.parse_args(argv)


def test_a_positional_field_is_an_argument_and_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = settings_from(parse("v1", "-o", "out.jsonl"), Example, command="example")
    assert (got.version, got.output, got.count) == ("v1", Path("out.jsonl"), 3)
    assert parse("--output", "o", "v2").version == "v2"  # the short flag and the long one
    with pytest.raises(SystemExit):
        parse("--count", "4")
    assert "required: VERSION" in capsys.readouterr().err
    info = Example.model_fields["version"]
    assert (flag_name("version", info), argument_name("version", info)) == (None, "VERSION")
    assert argument_name("count", Example.model_fields["count"]) is None


def test_the_environment_sets_a_flags_default_and_a_flag_beats_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONTHEJOB_EXAMPLE_COUNT", "7")
    assert settings_from(parse("v1"), Example, command="example").count == 7
    assert settings_from(parse("v1", "--count", "9"), Example, command="example").count == 9


def test_a_refused_value_stops_the_command_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_EXAMPLE_COUNT", "many")
    with pytest.raises(SystemExit, match=r"^onthejob example: count: Input should be a valid int"):
        settings_from(parse("v1"), Example, command="example")


def test_a_positional_with_a_default_is_refused() -> None:
    class Optional(BaseSettings):
        version: str = setting("v0", "which one", positional=True)

    with pytest.raises(TypeError, match="argument VERSION"):
        parse(settings=Optional)
