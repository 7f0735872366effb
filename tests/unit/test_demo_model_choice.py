"""`onthejob demo` learns on the real pretrained model by default; --tiny and --curriculum
run the warmed-up tiny one, each with its own default minutes."""

from __future__ import annotations

import argparse

import pytest

from learner.demo import cli


def parsed(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["demo", *args])


@pytest.mark.parametrize(
    ("args", "model"),
    [
        ((), cli.DEFAULT_MODEL),
        (("--tiny",), None),
        (("--curriculum",), None),
        (("--model", "/models/mine"), "/models/mine"),
        (("--curriculum", "--model", "smollm2-135m"), "smollm2-135m"),
    ],
)
def test_the_demo_model(args: tuple[str, ...], model: str | None) -> None:
    assert cli.demo_model(parsed(*args)) == model


def test_tiny_and_a_model_together_are_refused() -> None:
    with pytest.raises(SystemExit, match="--tiny and --model"):
        cli.demo_model(parsed("--tiny", "--model", "smollm2-135m"))


def test_the_default_is_a_model_the_repository_knows_how_to_prepare() -> None:
    from learner.real_models import MODELS

    assert cli.DEFAULT_MODEL in MODELS


@pytest.mark.parametrize(
    ("args", "minutes"),
    [
        ((), cli.REAL_MODEL_MINUTES),
        (("--tiny",), cli.TINY_MINUTES),
        (("--tiny", "--minutes", "2"), 2.0),
        (("--minutes", "14"), 14.0),
    ],
)
def test_each_model_has_its_default_minutes(args: tuple[str, ...], minutes: float) -> None:
    assert cli.demo_config(parsed(*args)).minutes == minutes
