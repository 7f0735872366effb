"""Proxy settings from the environment, as the README, docs/operations.md and `serve
--help` describe them."""

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


def test_keys_are_required_off_loopback_and_when_asked() -> None:
    assert not Settings(host="127.0.0.1").keys_required
    assert not Settings(host="::1").keys_required
    assert Settings(host="0.0.0.0", admin_token="t").keys_required
    assert Settings(host="proxy.internal", admin_token="t").keys_required
    assert Settings(host="127.0.0.1", require_keys=True).keys_required
