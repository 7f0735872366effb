"""What the learner hands the trackers: numbers only, flattened; settings without secrets."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from learner.config import LearnerConfig
from learner.trackers import Reporter, flatten, run_config


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


class Recorded:
    name = "recorded"

    def __init__(self) -> None:
        self.lines: list[tuple[int, dict[str, float]]] = []

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.lines.append((step, dict(values)))

    def close(self) -> None:
        pass


def test_the_watch_goes_to_the_trackers_as_numbers_per_detector(tmp_path: Path) -> None:
    reporter = Reporter([], tmp_path, "run", {})
    tracker = Recorded()
    reporter.trackers.append(tracker)
    reporter.watch(7, {"reply length collapsing": 1, "reward up, complaints up": 0}, {3: True})
    assert tracker.lines == [
        (
            7,
            {
                "watch/reply_length_collapsing": 1.0,
                "watch/reward_up_complaints_up": 0.0,
                "watch/held/3": 1.0,
            },
        )
    ]
