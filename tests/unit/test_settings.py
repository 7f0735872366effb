"""Proxy settings from the environment, as the README and `serve --help` describe them."""

from __future__ import annotations

import pytest

from proxy.settings import Settings


def test_upstreams_come_comma_separated_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ONTHEJOB_UPSTREAMS", "http://a:8000/,http://b:8001")
    assert Settings().upstreams == ["http://a:8000", "http://b:8001"]
    monkeypatch.setenv("ONTHEJOB_UPSTREAMS", "http://only:8000")
    assert Settings().upstreams == ["http://only:8000"]
