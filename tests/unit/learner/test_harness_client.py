"""learner/harness_client.py: the harnesses' question comes from the argument, else
ONTHEJOB_PROMPT, else stdin; the client needs OPENAI_BASE_URL; both read only the environment
they are given. Its HTTP errors are tested through the tool agent
(tests/unit/learner/rollout/tool_tasks/test_agent.py)."""

from __future__ import annotations

import argparse
import io

import pytest

from learner.harness_client import ModelError, connect, question


def test_the_question_is_the_argument_else_the_environment_else_stdin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = argparse.ArgumentParser()
    monkeypatch.setattr("sys.stdin", io.StringIO(" from stdin \n"))
    assert question(parser, " asked ", {"ONTHEJOB_PROMPT": "env"}) == "asked"
    assert question(parser, None, {"ONTHEJOB_PROMPT": "env"}) == "env"
    assert question(parser, None, {}) == "from stdin"
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    with pytest.raises(SystemExit) as exited:
        question(parser, None, {})
    assert exited.value.code == 2


def test_connecting_needs_openai_base_url_and_reaches_it() -> None:
    parser = argparse.ArgumentParser()
    with pytest.raises(SystemExit) as exited:
        connect(parser, "m", {}, timeout_s=1)
    assert exited.value.code == 2
    complete = connect(parser, "m", {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, timeout_s=1)
    with pytest.raises(ModelError, match="could not be reached"):
        complete([{"role": "user", "content": "hi"}])
