"""The learner's settings as `onthejob learn` and ONTHEJOB_LEARN_* give them."""

from __future__ import annotations

import pytest

from learner.commands import learner_config
from learner.config import LearnerConfig
from proxy.cli import build_parser


def test_learning_is_limited_to_client_keys_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = build_parser().parse_args(["learn", "--model", "m", "--keys", "ci, team-a"])
    assert learner_config(args, model=args.model, keys=args.keys).keys == ["ci", "team-a"]
    monkeypatch.setenv("ONTHEJOB_LEARN_KEYS", "batch,ci")
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).keys == ["batch", "ci"]
    monkeypatch.delenv("ONTHEJOB_LEARN_KEYS")
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).keys == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["learn", "--keys", ","])
