"""`onthejob export` and `onthejob spool replay`: their flags come from
proxy/command_settings.py (and ONTHEJOB_EXPORT_* / ONTHEJOB_SPOOL_*), and the command lines
people type still parse as they did."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.flags import settings_from
from cli.main import build_parser
from proxy.command_settings import ExportSettings, SpoolReplaySettings


def export(*argv: str) -> ExportSettings:
    args = build_parser().parse_args(["export", *argv])
    return settings_from(args, ExportSettings, command="export")


def test_export_takes_its_flags_as_before() -> None:
    got = export("--db", "sqlite:///x.db", "--type", "kind", "--format", "trl", "-o", "out")
    assert (got.database_url, got.interaction_type, got.format, got.output) == (
        "sqlite:///x.db",
        "kind",
        "trl",
        Path("out"),
    )
    assert export().format == "jsonl" and export().output is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--format", "csv"])


def test_export_reads_the_environment_under_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONTHEJOB_EXPORT_FORMAT", "parquet")
    monkeypatch.setenv("ONTHEJOB_EXPORT_SESSION", "s1")
    got = export("--session", "s2")
    assert (got.format, got.session) == ("parquet", "s2")
    monkeypatch.setenv("ONTHEJOB_EXPORT_FORMAT", "csv")
    with pytest.raises(SystemExit, match="onthejob export: format: Input should be"):
        export()


def test_spool_replay_reads_the_proxys_spool_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def replay(*argv: str) -> SpoolReplaySettings:
        args = build_parser().parse_args(["spool", "replay", *argv])
        return settings_from(args, SpoolReplaySettings, command="spool replay")

    monkeypatch.delenv("ONTHEJOB_SPOOL_PATH", raising=False)
    assert replay().path == Path("onthejob-spool.jsonl")
    monkeypatch.setenv("ONTHEJOB_SPOOL_PATH", "/var/spool/proxy.jsonl")  # the proxy's --spool
    assert replay().path == Path("/var/spool/proxy.jsonl")
    assert replay("--spool", "here.jsonl", "--db", "sqlite:///x.db").path == Path("here.jsonl")
