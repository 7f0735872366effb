"""What the processes read from their environment beyond their own settings classes
(proxy/settings.py, learner/config.py): the database both use, and the conventions of the
tools around them (torchrun's ranks, W&B, MLflow, the OpenAI SDK's key). Read here and
nowhere else (tests/unit/test_environment_reads.py), each time it is asked for, so a changed
environment is seen."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Environment(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    # an explicit URL (a flag, a settings field) wins over it (store/url.py)
    database_url: str | None = Field(None, validation_alias="ONTHEJOB_DATABASE_URL")
    # where `onthejob models prepare` keeps converted models (learner/real_models.py)
    model_cache: str | None = Field(None, validation_alias="ONTHEJOB_MODEL_CACHE")
    # the judge's key where none is configured: vLLM without --api-key takes any
    openai_api_key: SecretStr | None = Field(None, validation_alias="OPENAI_API_KEY")
    # set by torchrun for each rank it starts (learner/distributed.py)
    world_size: int = Field(1, validation_alias="WORLD_SIZE")
    local_rank: int = Field(0, validation_alias="LOCAL_RANK")
    # the trackers' own conventions (learner/trackers.py)
    wandb_project: str = Field("onthejob", validation_alias="WANDB_PROJECT")
    wandb_mode: str = Field("offline", validation_alias="WANDB_MODE")
    mlflow_tracking_uri: str | None = Field(None, validation_alias="MLFLOW_TRACKING_URI")


def environment() -> Environment:
    return Environment()
