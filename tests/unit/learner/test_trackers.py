"""What the learner hands the trackers: numbers only, flattened; settings without secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from learner.config import LearnerConfig
from learner.trackers import flatten, run_config


def test_metrics_are_flattened_to_numbers() -> None:
    metrics = {
        "mean_reward": 0.5,
        "trained_samples": 2,
        "published": True,
        "loss": float("nan"),  # a NaN says nothing to a chart
        "skipped_calls": {"sampling unknown": 1},
        "dropped": [
            {"reason": "stale", "unit": "trajectories", "count": 3, "setting": "--max-staleness"},
            {"reason": "truncated", "unit": "samples", "count": 1, "setting": "x"},
        ],
        "version": "step-1-abc",
        "policy_versions": ["v1", "v2"],
    }
    assert flatten(metrics) == {
        "mean_reward": 0.5,
        "trained_samples": 2.0,
        "published": 1.0,
        "skipped_calls/sampling unknown": 1.0,
        "dropped/stale": 3.0,
        "dropped/truncated": 1.0,
    }


def test_the_run_config_keeps_no_password() -> None:
    config = LearnerConfig(
        database_url="postgresql://learner:s3cret@db:5432/onthejob",
        model="m",
        report_to=["tensorboard"],
        report_dir=Path("runs"),
    ).model_dump()
    stored = run_config(config)
    assert "s3cret" not in str(stored)
    assert stored["database_url"] == "postgresql://learner:***@db:5432/onthejob"
    assert stored["report_to"] == "tensorboard" and stored["report_dir"] == "runs"


def test_report_to_names_known_trackers() -> None:
    config = LearnerConfig(model="m", report_to="TensorBoard, wandb,none,wandb")
    assert config.report_to == ["tensorboard", "wandb"]
    assert LearnerConfig(model="m", report_to="none").report_to == []
    with pytest.raises(ValueError, match="unknown tracker comet"):
        LearnerConfig(model="m", report_to=["comet"])
