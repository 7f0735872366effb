"""The settings of the learner's smaller commands (`rollback`, `pin`/`unpin`, `regrade`,
`models`, `tasks load`) and of `--config`: their flags and arguments are generated from these
(cli/flags.py), and the flags of rollback, pin, regrade and models can come from the
environment too (ONTHEJOB_<COMMAND>_*); --config and tasks load's are flags only. Where
they open the store or reach vLLM, they take the learner's own settings as well
(learner/config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import field_validator
from pydantic_settings import BaseSettings, NoDecode

from learner import real_models
from store.settings_fields import comma_list, command_config, setting

MODEL_NAMES = tuple(sorted(real_models.MODELS))
ModelName = Literal[MODEL_NAMES]  # type: ignore[valid-type]  # the names `models list` shows


class RollbackSettings(BaseSettings):
    model_config = command_config("ONTHEJOB_ROLLBACK_")

    version: str = setting(
        help="a verified version (the admin API's /versions)", positional=True, metavar="VERSION"
    )


class PinSettings(BaseSettings):
    model_config = command_config("ONTHEJOB_PIN_")

    version: str = setting(
        help="a policy version (the admin API's /versions)", positional=True, metavar="VERSION"
    )


class RegradeSettings(BaseSettings):
    """Which trajectories `onthejob regrade` grades again: those matching every filter given."""

    model_config = command_config("ONTHEJOB_REGRADE_")

    failed: bool = setting(False, "only trajectories whose grading failed")
    session: str | None = setting(None, "only this session key", metavar="KEY")
    task: str | None = setting(None, "only this task key", metavar="KEY")
    since: str | None = setting(None, "active at or after this time", metavar="ISO8601")
    until: str | None = setting(None, "started before this time", metavar="ISO8601")
    trajectory: Annotated[list[str], NoDecode] = setting(
        default_factory=list,
        help="this trajectory; repeat for more (environment: comma-separated)",
        metavar="ID",
        repeat=True,
    )

    @field_validator("trajectory", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return comma_list(value) if isinstance(value, str) else value


class ModelsSettings(BaseSettings):
    # cache: ONTHEJOB_MODEL_CACHE, the one variable real_models reads everywhere else
    model_config = command_config("ONTHEJOB_MODEL_")

    cache: Path | None = setting(
        None,
        "model cache (default: ~/.cache/onthejob/models)",
        metavar="DIR",
    )


class ModelPrepareSettings(ModelsSettings):
    name: ModelName = setting(
        help=f"{', '.join(MODEL_NAMES)} (see `models list`)", positional=True, metavar="NAME"
    )


class ConfigFileSettings(BaseSettings):
    """Where `learn`'s and `regrade`'s other settings may come from besides the environment;
    a flag only (the command reads it from its arguments)."""

    model_config = command_config("ONTHEJOB_LEARN_")

    config: Path | None = setting(None, "TOML file with settings", metavar="FILE")


class TasksLoadSettings(BaseSettings):
    """`onthejob tasks load FILE`, flags only (the command reads them from its arguments);
    its database is the `--db` every store command takes."""

    model_config = command_config("ONTHEJOB_TASKS_")

    file: Path = setting(help="a JSONL task set", positional=True, metavar="FILE")
    migrate: bool = setting(
        False,
        "upgrade the database schema first; without it a schema that is behind stops the "
        "command with what to run (`onthejob db upgrade`)",
    )
