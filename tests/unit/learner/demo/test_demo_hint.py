"""The demo's last line (learner/demo/run.py: look_again_hint) works as printed: the whole
`onthejob serve` command, with the admin token the dashboard asks for, and where it listens."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cli.main import build_parser
from learner.demo.run import LATER_DASHBOARD, look_again_hint
from proxy.settings import Settings


def command_of(hint: str) -> list[str]:
    prefix = "to look again later: "
    assert prefix in hint
    return shlex.split(hint.split(prefix, 1)[1].split(", then ", 1)[0])


def test_the_hint_is_a_whole_command_with_the_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "a demo"  # a space, quoted so that the command still runs
    db_url = f"sqlite:///{workdir / 'onthejob.db'}"
    hint = look_again_hint(admin_token="tok-1", db_url=db_url, model_dir=workdir / "model")
    assignment, program, *args = command_of(hint)
    name, token = assignment.split("=", 1)
    assert program == "onthejob" and token == "tok-1"
    serve = build_parser().parse_args(args)
    assert serve.command == "serve" and serve.database_url == db_url
    assert serve.tokenizer == workdir / "model"
    monkeypatch.setenv(name, token)
    assert Settings().admin_token == "tok-1"  # the admin API, and so the dashboard, is on
    assert f"{LATER_DASHBOARD}/admin with that token" in hint
    assert hint.endswith(f"onthejob export --db {shlex.quote(db_url)}")


def test_the_dashboard_it_names_is_where_serve_listens_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ONTHEJOB_HOST", "ONTHEJOB_PORT"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert LATER_DASHBOARD == f"http://{settings.host}:{settings.port}"
