"""`onthejob rollout`'s flags come from RolloutSettings (and ONTHEJOB_ROLLOUT_*); the flags
that go together are checked together, with a message that names them."""

from __future__ import annotations

import argparse

import pytest

from cli import rollout as cli
from learner.rollout.settings import RolloutSettings, reward_or_none


def settings(*args: str) -> RolloutSettings:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return cli.rollout_settings(parser.parse_args(["rollout", *args, "--", "true"]))


BASE = ("--proxy", "http://127.0.0.1:9")


def test_the_flags_set_the_settings() -> None:
    got = settings(*BASE, "--tasks", "t.jsonl", "--group-size", "8", "--no-progress")
    assert (got.tasks, got.group_size, got.progress, got.failure_reward) == (
        "t.jsonl",
        8,
        False,
        0.0,
    )
    assert settings(*BASE, "--tasks", "t", "--failure-reward", "NONE").failure_reward is None
    assert settings(*BASE, "--tasks", "t", "--failure-reward", "-1").failure_reward == -1.0


def test_the_environment_sets_what_no_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_ROLLOUT_PROXY", "http://proxy:8080")
    monkeypatch.setenv("ONTHEJOB_ROLLOUT_FAILURE_REWARD", "none")
    monkeypatch.setenv("ONTHEJOB_ROLLOUT_CONCURRENCY", "2")
    got = settings("--tasks", "t", "--concurrency", "3")
    assert (got.proxy, got.failure_reward, got.concurrency) == ("http://proxy:8080", None, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tasks", "t"), "--proxy URL is required"),
        (BASE, "give one of --tasks FILE and --curriculum FILE"),
        ((*BASE, "--tasks", "t", "--curriculum", "c.toml"), "give one of --tasks"),
        ((*BASE, "--tasks", "t", "--minutes", "3"), "--minutes needs --curriculum"),
        ((*BASE, "--tasks", "t", "--step-wait", "5"), "--step-wait needs --curriculum"),
        ((*BASE, "--curriculum", "c.toml", "--eval"), "--eval does not go with --curriculum"),
        ((*BASE, "--curriculum", "c.toml", "--epochs", "2"), "--epochs does not go with"),
    ],
)
def test_flags_that_do_not_go_together_are_refused(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        settings(*args)


def test_a_reward_that_is_not_a_number_is_refused_by_the_parser() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="'none'"):
        reward_or_none("lots")
