"""Client keys: who may use the model through the proxy, and whose traffic a call is.

A key is `otj_<id>_<secret>`: a public id (16 hex digits) and 256 random bits, shown once
when it is made (`POST /admin/api/keys`). The store keeps the id, the key's name and the
key's SHA-256, never the key: a slow password hash buys nothing against a 256-bit random
secret, and the check runs on every call. The proxy holds the active keys in memory, read
from the store at start and every `key_poll_interval` seconds (keys made or revoked through
another proxy), so a check is one hash, one dict lookup by id and a constant-time compare,
and clients are still let in while the database is away.

Clients send a key as `Authorization: Bearer <key>` (OpenAI SDKs), `x-api-key: <key>`
(Anthropic SDKs) or `x-goog-api-key: <key>` (Gemini clients); all are read on every API.
Bound off loopback (or with `require_keys`) a call without a valid key is refused with a
401 in its API's error shape, before anything is recorded or sent upstream. On loopback
keys are optional: a valid key names the call's traffic, a key of ours that is wrong or
revoked is refused, and any other value passes as before (it may be vLLM's own
`--api-key`, so it goes on upstream).

Invariant: a key of ours is never stored, logged, recorded or sent upstream; calls record
its name.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping

from sqlalchemy import Engine

from proxy.base.errors import ServiceUnavailable, Unauthorized
from proxy.base.followed import Followed
from store import keys as store

log = logging.getLogger("onthejob.keys")

PREFIX = "otj"
_ID_HEX = 16
_NO_HEADERS: Mapping[str, str] = {}
# ASGI header names are lower-case; x-goog-api-key: Gemini clients
_AUTH_NAMES = (b"authorization", b"x-api-key", b"x-goog-api-key")


def new_key() -> tuple[str, str, str]:
    """(key id, key, its digest) of a fresh key."""
    key_id = secrets.token_hex(_ID_HEX // 2)
    key = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    return key_id, key, digest(key)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_id_of(key: str) -> str | None:
    """The id part of a key of ours; None for anything else (another service's key)."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != _ID_HEX or not parts[2]:
        return None
    return parts[1]


def presented(headers: Mapping[str, str]) -> list[str]:
    """The keys a request carries: its bearer token and its x-api-key."""
    raw = getattr(headers, "raw", None)  # Starlette's: one pass, not a scan per name
    if raw is not None:
        pairs = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in raw if n in _AUTH_NAMES]
    else:
        names = ("authorization", "x-api-key", "x-goog-api-key")
        pairs = [(n, headers[n]) for n in names if n in headers]
    out = []
    for name, value in pairs:
        if name == "authorization":
            scheme, _, value = value.partition(" ")
            if scheme.lower() != "bearer":
                continue
        if value.strip():
            out.append(value.strip())
    return out


def upstream_view(headers: Mapping[str, str], key_name: str | None) -> Mapping[str, str]:
    """The client headers the upstream's auth is taken from: none once a key of ours let the
    call in (that key is for this proxy only), else the client's own."""
    return headers if key_name is None else _NO_HEADERS


class KeyRing(Followed[dict[str, tuple[str, str]]]):
    """The active client keys, in memory; `identify` is called on every call."""

    what = "client keys"

    def __init__(self, engine: Engine, *, required: bool, poll_interval: float) -> None:
        super().__init__(engine, poll_interval=poll_interval)
        self.required = required
        self._keys: dict[str, tuple[str, str]] = {}  # id -> (name, digest)

    def identify(self, headers: Mapping[str, str]) -> str | None:
        """The name of the valid client key the request carries, or None (no key of ours,
        keys optional). Raises Unauthorized (401), or ServiceUnavailable while keys are
        required and have never been read because the store is away."""
        offered = presented(headers)
        ours = False
        for key in offered:
            key_id = key_id_of(key)
            if key_id is None:
                continue
            ours = True
            entry = self._keys.get(key_id)
            if entry is not None and hmac.compare_digest(entry[1], digest(key)):
                return entry[0]
        if ours:
            raise Unauthorized("invalid or revoked client key", code="invalid_api_key")
        if not self.required:
            return None
        if not self.loaded:
            raise ServiceUnavailable(
                "client keys are not loaded yet (the database is unreachable); retry later"
            )
        if not self._keys:
            raise Unauthorized(
                "this proxy requires a client key and none exists yet: an operator creates "
                "one with POST /admin/api/keys",
                code="invalid_api_key",
            )
        if offered:
            raise Unauthorized("invalid client key", code="invalid_api_key")
        raise Unauthorized(
            "missing client key: send it as 'Authorization: Bearer <key>', 'x-api-key: <key>' "
            "or 'x-goog-api-key: <key>'",
            code="missing_api_key",
        )

    # -- following the store (proxy/base/followed.py) ---------------------------------------------
    async def start(self) -> None:
        await super().start()
        if self.loaded and self.required and not self._keys:
            log.warning(
                "client keys are required (bound off loopback) and none exists: every call "
                "is refused with 401 until one is created (POST /admin/api/keys)"
            )

    def _read(self) -> dict[str, tuple[str, str]]:
        with self.engine.connect() as conn:
            return store.active_keys(conn)

    def _install(self, value: dict[str, tuple[str, str]]) -> None:
        self._keys = value

    # -- this process's admin API: effective at once ------------------------------------
    def added(self, key_id: str, name: str, key_digest: str) -> None:
        def add() -> None:
            self._keys = {**self._keys, key_id: (name, key_digest)}

        self.changed_here(add)

    def revoked(self, key_id: str) -> None:
        def revoke() -> None:
            self._keys = {k: v for k, v in self._keys.items() if k != key_id}

        self.changed_here(revoke)
