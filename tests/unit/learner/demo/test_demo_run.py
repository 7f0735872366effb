"""What `onthejob demo` runs (learner/demo/run.py): the real model's learner on its defaults,
served in the dtype the CPU computes natively."""

from __future__ import annotations

from learner.demo.run import RECIPES, DemoConfig, _learning_rate, _threads


def test_the_demo_runs_its_real_model_learner_on_the_defaults() -> None:
    """The reading recipe passes no learning rate, no truncation rule and no threads: the
    learner's defaults, as a user runs it."""
    reading = RECIPES["reading"]
    assert reading.learning_rate is None and reading.learner_args == ()
    assert _learning_rate(None) == [] and _threads(None) == []
    assert _threads(3) == ["--torch-threads", "3"]
    assert _learning_rate(RECIPES["calculator"].learning_rate) == ["--learning-rate", "0.0001"]


def test_the_demo_serves_in_the_dtype_the_cpu_computes_natively() -> None:
    assert DemoConfig().dtype == "auto"  # learner.vllm_server.serving_dtype resolves it
