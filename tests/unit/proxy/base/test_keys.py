"""Client keys: their form, the headers they come in, and what the key ring decides."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from proxy.base import keys
from proxy.base.errors import ServiceUnavailable, Unauthorized


def test_a_key_is_an_id_and_256_random_bits_stored_as_its_sha256() -> None:
    key_id, key, digest = keys.new_key()
    assert key.startswith(f"otj_{key_id}_") and len(key_id) == 16
    assert len(key.split("_", 2)[2]) >= 43  # 32 random bytes, url-safe base64
    assert digest == hashlib.sha256(key.encode()).hexdigest()
    assert keys.key_id_of(key) == key_id
    assert keys.new_key()[1] != key
    for other in ("sk-abc", "otj_short_x", f"otj_{key_id}_", "otj", ""):
        assert keys.key_id_of(other) is None


def test_keys_come_as_a_bearer_token_or_an_x_api_key() -> None:
    assert keys.presented({"authorization": "Bearer k1"}) == ["k1"]
    assert keys.presented({"authorization": "bearer  k1 "}) == ["k1"]
    assert keys.presented({"x-api-key": "k2"}) == ["k2"]
    assert keys.presented({"authorization": "Bearer k1", "x-api-key": "k2"}) == ["k1", "k2"]
    assert keys.presented({"authorization": "Basic abc"}) == []
    assert keys.presented({"authorization": "Bearer ", "x-api-key": " "}) == []


def _ring(required: bool) -> tuple[keys.KeyRing, str]:
    ring = keys.KeyRing(create_engine("sqlite://"), required=required, poll_interval=1)
    key_id, key, digest = keys.new_key()
    ring.added(key_id, "ci", digest)
    ring.loaded = True
    return ring, key


@pytest.mark.parametrize("required", [True, False])
def test_a_valid_key_names_the_call_and_a_wrong_key_of_ours_is_refused(required: bool) -> None:
    ring, key = _ring(required)
    assert ring.identify({"authorization": f"Bearer {key}"}) == "ci"
    assert ring.identify({"authorization": "Bearer sk-x", "x-api-key": key}) == "ci"
    for wrong in (key[:-1] + ("A" if key[-1] != "A" else "B"), "otj_0123456789abcdef_nope"):
        with pytest.raises(Unauthorized, match="invalid or revoked"):
            ring.identify({"x-api-key": wrong})


def test_required_keys_refuse_anything_else_and_say_why() -> None:
    ring, key = _ring(required=True)
    with pytest.raises(Unauthorized, match="missing client key") as missing:
        ring.identify({})
    assert missing.value.code == "missing_api_key"
    with pytest.raises(Unauthorized, match="invalid client key"):
        ring.identify({"authorization": "Bearer sk-someone-elses"})
    ring.revoked(keys.key_id_of(key) or "")
    with pytest.raises(Unauthorized, match="invalid or revoked"):
        ring.identify({"authorization": f"Bearer {key}"})
    with pytest.raises(Unauthorized, match="none exists yet"):
        ring.identify({})


def test_optional_keys_let_other_values_through_unnamed() -> None:
    ring, _ = _ring(required=False)
    assert ring.identify({}) is None
    assert ring.identify({"authorization": "Bearer vllm-key"}) is None


def test_required_keys_never_read_because_the_store_is_away_are_a_503(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "onthejob.db"
    ring = keys.KeyRing(create_engine(f"sqlite:///{missing}"), required=True, poll_interval=1)
    asyncio.run(ring.start())  # logs, does not raise
    assert not ring.loaded
    with pytest.raises(ServiceUnavailable, match="not loaded yet"):
        ring.identify({"authorization": "Bearer sk-anything"})


def test_our_key_is_never_sent_upstream() -> None:
    headers = {"authorization": "Bearer otj_x", "x-api-key": "otj_x"}
    assert dict(keys.upstream_view(headers, "ci")) == {}
    assert keys.upstream_view(headers, None) is headers


def test_starlette_headers_are_read_in_one_pass_with_the_same_result() -> None:
    from starlette.datastructures import Headers

    headers = Headers(
        raw=[(b"x-api-key", b"k2"), (b"user-agent", b"ua"), (b"authorization", b"Bearer k1")]
    )
    assert sorted(keys.presented(headers)) == ["k1", "k2"]
    assert keys.presented(Headers(raw=[(b"authorization", b"Basic x")])) == []
