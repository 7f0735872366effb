"""`onthejob demo` learns on the real pretrained model by default; --tiny and --curriculum
run the warmed-up tiny one, each with its own default minutes. Its flags are generated from
its settings, which the environment can set too."""

from __future__ import annotations

import argparse

import pytest

from cli import demo as cli
from learner.demo import settings
from tests.support.flags import check_flags


def parsed(*args: str) -> settings.DemoSettings:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return cli.demo_settings(parser.parse_args(["demo", *args]))


def test_every_setting_has_its_flag_and_every_flag_is_a_setting() -> None:
    commands = argparse.ArgumentParser().add_subparsers()
    cli.register(commands)
    check_flags(commands.choices["demo"], settings.DemoSettings, set())


@pytest.mark.parametrize(
    ("args", "model"),
    [
        ((), settings.DEFAULT_MODEL),
        (("--tiny",), None),
        (("--curriculum",), None),
        (("--model", "/models/mine"), "/models/mine"),
        (("--curriculum", "--model", "smollm2-135m"), "smollm2-135m"),
    ],
)
def test_the_demo_model(args: tuple[str, ...], model: str | None) -> None:
    assert parsed(*args).demo_model() == model


def test_tiny_and_a_model_together_are_refused() -> None:
    with pytest.raises(SystemExit, match="--tiny and --model"):
        parsed("--tiny", "--model", "smollm2-135m").demo_model()


def test_the_default_is_a_model_the_repository_knows_how_to_prepare() -> None:
    from learner.real_models import MODELS

    assert settings.DEFAULT_MODEL in MODELS


@pytest.mark.parametrize(
    ("args", "minutes"),
    [
        ((), settings.REAL_MODEL_MINUTES),
        (("--tiny",), settings.TINY_MINUTES),
        (("--tiny", "--minutes", "2"), 2.0),
        (("--minutes", "14"), 14.0),
    ],
)
def test_each_model_has_its_default_minutes(args: tuple[str, ...], minutes: float) -> None:
    assert cli.demo_config(parsed(*args)).minutes == minutes


def test_a_flag_wins_over_the_environment_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parsed().port == 8080 and parsed().band_check is True
    monkeypatch.setenv("ONTHEJOB_DEMO_PORT", "9090")
    monkeypatch.setenv("ONTHEJOB_DEMO_BAND_CHECK", "false")
    assert parsed().port == 9090 and parsed().band_check is False
    assert parsed("--port", "7070", "--band-check").port == 7070
    assert parsed("--band-check").band_check is True


def test_a_bad_value_from_the_environment_stops_with_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONTHEJOB_DEMO_TASKS", "poetry")
    with pytest.raises(SystemExit, match=r"onthejob demo: (?s:.*)tasks"):
        parsed()
