"""`onthejob rollout`'s settings: its flags are generated from these (cli/flags.py),
and each can come from the environment (ONTHEJOB_ROLLOUT_*) too."""

from __future__ import annotations

import argparse
from typing import Annotated, Any

from pydantic import field_validator
from pydantic_settings import BaseSettings

from store.settings_fields import FlagParse, command_config, setting

# only with --curriculum, and their values that mean "not given"
CURRICULUM_ONLY = {"max_rounds": None, "minutes": None, "step_wait": 0.0}


def reward_or_none(text: str) -> float | str:
    """A reward from the command line: a number, or 'none' (no reward)."""
    if text.lower() == "none":
        return "none"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None


class RolloutSettings(BaseSettings):
    model_config = command_config("ONTHEJOB_ROLLOUT_")

    proxy: str | None = setting(None, "the onthejob proxy (required)", metavar="URL")
    tasks: str | None = setting(None, "task set (JSONL); or --curriculum", metavar="FILE")
    curriculum: str | None = setting(
        None,
        "a curriculum (TOML): its stages in order, each trained on and evaluated until its "
        "promotion rule holds; resumes at the stage recorded in the store",
        metavar="FILE",
    )
    name: str | None = setting(None, "task set name for eval results (default: file stem)")
    group_size: int = setting(4, "runs per task: one GRPO group", metavar="G")
    concurrency: int = setting(4, "harness runs at a time", metavar="C")
    epochs: int = setting(1, "passes over the task set", metavar="E")
    timeout: float = setting(600.0, "seconds per run", metavar="S")
    eval: bool = setting(False, "no training signal: report success per task")
    database_url: str | None = setting(
        None,
        "the proxy's database (default: $ONTHEJOB_DATABASE_URL, else the one the proxy says it "
        "records to); a database that is not the proxy's is refused",
        flag="--db",
        metavar="URL",
    )
    migrate: bool = setting(
        False,
        "upgrade the database schema first; without it a schema that is behind stops the "
        "command with what to run (`onthejob db upgrade`)",
    )
    grader: str | None = setting(
        None, "grader for tasks without check/grader (learner SPEC)", metavar="SPEC"
    )
    failure_reward: Annotated[float | None, FlagParse(reward_or_none)] = setting(
        0.0,
        "reward of a run that timed out or exited non-zero ('none': no reward)",
        metavar="X",
    )
    success_threshold: float = setting(
        1.0, "eval: a run succeeds with at least this reward", metavar="X"
    )
    check_timeout: float = setting(
        120.0, "seconds per check command; a check that takes longer grades nothing", metavar="S"
    )
    keep_workdirs: bool = setting(False, "keep the runs' working directories")
    max_rounds: int | None = setting(
        None,
        "curriculum: stop after N training rounds (evals due after the last one still run)",
    )
    minutes: float | None = setting(
        None, "curriculum: start no round or eval after M minutes", metavar="M"
    )
    step_wait: float = setting(
        0.0,
        "curriculum: after a round with a training signal, wait up to S seconds for the "
        "learner's next version to serve (0: do not wait)",
        metavar="S",
    )
    progress: bool = setting(True, "show a progress bar")

    @field_validator("failure_reward", mode="before")
    @classmethod
    def _none_means_no_reward(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() == "none" else value
