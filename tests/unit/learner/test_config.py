"""The learner's settings as `onthejob learn` and ONTHEJOB_LEARN_* give them."""

from __future__ import annotations

import pytest

from cli.learn import learner_config
from cli.main import build_parser
from learner.config import LearnerConfig


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


def test_a_step_s_batch_is_bounded_by_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ONTHEJOB_LEARN_MAX_BATCH_TRAJECTORIES", raising=False)
    assert (
        LearnerConfig.load(config_file=None, overrides={"model": "m"}).max_batch_trajectories == 32
    )
    args = build_parser().parse_args(["learn", "--model", "m", "--max-batch-trajectories", "48"])
    config = learner_config(args, model="m", max_batch_trajectories=args.max_batch_trajectories)
    assert config.max_batch_trajectories == 48
    monkeypatch.setenv("ONTHEJOB_LEARN_MAX_BATCH_TRAJECTORIES", "0")  # 0: no bound
    assert (
        LearnerConfig.load(config_file=None, overrides={"model": "m"}).max_batch_trajectories == 0
    )
    monkeypatch.setenv("ONTHEJOB_LEARN_MAX_BATCH_TRAJECTORIES", "-1")
    with pytest.raises(ValueError, match="max_batch_trajectories"):
        LearnerConfig.load(config_file=None, overrides={"model": "m"})


def test_the_trainer_s_threads_come_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ONTHEJOB_LEARN_TORCH_THREADS", raising=False)
    assert LearnerConfig.load(config_file=None, overrides={"model": "m"}).torch_threads == 0
    args = build_parser().parse_args(["learn", "--model", "m", "--torch-threads", "1"])
    assert learner_config(args, model="m", torch_threads=args.torch_threads).torch_threads == 1
    monkeypatch.setenv("ONTHEJOB_LEARN_TORCH_THREADS", "-2")
    with pytest.raises(ValueError, match="torch_threads"):
        LearnerConfig.load(config_file=None, overrides={"model": "m"})


def test_per_turn_credit_is_the_default_for_next_turn_grades_only() -> None:
    def load(**overrides: object) -> LearnerConfig:
        return LearnerConfig.load(config_file=None, overrides={"model": "m", **overrides})

    assert load(graders=["next_turn"]).turn_credit
    assert load(graders=["next_turn:judge@2"]).turn_credit
    assert not load(graders=["next_turn", "judge"]).turn_credit  # the judge's reward counts
    assert not load().turn_credit  # reference
    assert (
        load(credit="turn").turn_credit
        and not load(graders=["next_turn"], credit="trajectory").turn_credit
    )
    with pytest.raises(ValueError, match="no control"):
        load(graders=["next_turn"], shuffle_rewards=True)
    with pytest.raises(ValueError, match="NAME=WEIGHT"):
        load(signal_weights=["alice"])
    args = build_parser().parse_args(
        ["learn", "--signal-weight", "eve=0", "--signal-weight", "*=0.5"]
    )
    assert args.signal_weights == ["eve=0", "*=0.5"]
