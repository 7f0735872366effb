"""`learner/proxy_process.py`: a proxy that does not come up says where it is stuck."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from learner.proxy_process import ProxyServer


def test_a_proxy_stuck_in_its_start_is_stopped_with_its_stacks_in_the_error(
    tmp_path: Path,
) -> None:
    # a database that takes the connection and never says a word: the start hangs there
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    proxy = ProxyServer(
        ["http://127.0.0.1:9"],
        db_url=f"postgresql://nobody@127.0.0.1:{port}/nothing",
        spool=tmp_path / "spool.jsonl",
        log_path=tmp_path / "proxy.log",
    )
    try:
        with pytest.raises(TimeoutError, match="proxy not up after 3") as raised:
            proxy.start(timeout=3)
    finally:
        silent.close()
    assert "Fatal Python error: Aborted" in str(raised.value)
    assert 'File "' in str(raised.value)  # the stack of the thread it was stuck in
    assert proxy.proc is None or proxy.proc.poll() is not None


def test_a_proxy_run_on_its_defaults_gets_no_setting_from_the_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONTHEJOB_ANSWERED_IDLE_TIMEOUT", "2")
    where = {"db_url": "sqlite://", "spool": tmp_path / "s", "log_path": tmp_path / "l"}
    inherits = ProxyServer(["http://127.0.0.1:9"], **where)
    own = ProxyServer(["http://127.0.0.1:9"], **where, settings_from_environment=False)
    assert inherits.env["ONTHEJOB_ANSWERED_IDLE_TIMEOUT"] == "2"
    assert "ONTHEJOB_ANSWERED_IDLE_TIMEOUT" not in own.env
    assert own.env["PATH"] == inherits.env["PATH"]  # the rest is passed on
