"""`onthejob export`'s and `onthejob spool replay`'s settings: their flags are generated from
these (cli/flags.py), and each can come from the environment too (ONTHEJOB_EXPORT_*,
ONTHEJOB_SPOOL_*)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings

from proxy.settings import Settings
from store.export_formats import ExportFormat
from store.settings_fields import command_config, setting
from store.url import database_setting


class ExportSettings(BaseSettings):
    model_config = command_config("ONTHEJOB_EXPORT_")

    database_url: str | None = database_setting()
    session: str | None = setting(None, "only this session key", metavar="KEY")
    since: str | None = setting(
        None, "only trajectories active at or after this time", metavar="ISO8601"
    )
    interaction_type: str | None = setting(
        None,
        "only trajectories of this interaction type (X-Onthejob-Type or auto:...)",
        flag="--type",
        metavar="TYPE",
    )
    format: ExportFormat = setting(
        "jsonl",
        "jsonl (the export format), parquet (needs --output and "
        "`pip install 'onthejob[export]'`) or trl",
    )
    output: Path | None = setting(None, "write here instead of stdout", short="-o", metavar="FILE")


class SpoolReplaySettings(BaseSettings):
    # `path` comes from ONTHEJOB_SPOOL_PATH, the variable the proxy's --spool reads too
    model_config = command_config("ONTHEJOB_SPOOL_")

    database_url: str | None = database_setting()
    path: Path = setting(
        Settings.model_fields["spool_path"].default,
        "the proxy's --spool; $ONTHEJOB_SPOOL_PATH sets both",
        flag="--spool",
        metavar="FILE",
    )
