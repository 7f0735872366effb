"""Proxy configuration: one Settings object, built by the CLI (flags) or from ONTHEJOB_* env."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from proxy.api.translate.policy import HOSTED_TOOL_MODES
from store.url import DEFAULT_SQLITE_URL


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ONTHEJOB_", extra="ignore")

    # NoDecode: the environment gives a comma-separated list, not JSON
    upstreams: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"]
    )
    host: str = "127.0.0.1"
    port: int = 8080
    database_url: str = DEFAULT_SQLITE_URL
    # Base path of the call log (`<spool>.d/`, every call until it is in the database) and
    # of `<spool>.rejected` (rows the database refused).
    spool_path: Path = Path("onthejob-spool.jsonl")
    # The call log is fsynced this often: what a crash of the whole machine can lose.
    log_fsync_interval: float = 0.1
    log_segment_bytes: int = 64 << 20
    # A trajectory with no call for this long is finished.
    idle_timeout: float = 300.0
    max_body_bytes: int = 32 * 1024 * 1024
    upstream_connect_timeout: float = 5.0
    # Generation can be long; this bounds one whole upstream call.
    upstream_timeout: float = 600.0
    # Sent upstream instead of the client's Authorization header when set.
    upstream_api_key: str | None = None
    policy_poll_interval: float = 1.0
    # How often the swap gates are read from the store (proxy/upstream/gates.py), and how long a
    # request waits for a gated replica before it is answered 503.
    gate_poll_interval: float = 0.25
    gate_wait: float = 60.0
    flush_interval: float = 0.05
    # The writer's batch: all the calls it holds in memory, in calls and in bytes.
    flush_batch_size: int = 500
    flush_batch_bytes: int = 8 << 20
    # How a replica that failed is retried: first after this many seconds, doubling.
    upstream_retry_after: float = 1.0
    # auto: stream tool calls, and fall back to a non-streaming upstream call re-emitted as
    # a stream once an upstream is seen dropping streamed tool-call token ids.
    stream_tools_mode: str = "auto"
    # A new SQLite database gets its schema at start unless this is false; `migrate`
    # upgrades any database at start. Otherwise a schema that is behind (SQLite or
    # PostgreSQL) stops the proxy from starting, with what to run.
    auto_migrate: bool = True
    migrate: bool = False
    # Fan-out: single-turn chat requests are sampled this many times upstream, the client
    # gets the first answer and all are recorded as one GRPO group. 1 = off.
    fanout: int = 1
    # Tools the served model cannot be given (run by the vendor: web search, MCP, ...), in
    # translated Messages/Responses requests: omit (left out, recorded) or refuse (a 400).
    hosted_tools: str = "omit"
    # Client keys (proxy/api/keys.py) are required off loopback; this requires them on loopback
    # too (e.g. behind a reverse proxy on the same host). Keys made or revoked through
    # another proxy take effect here within `key_poll_interval` seconds.
    require_keys: bool = False
    key_poll_interval: float = 1.0
    # bearer tokens: feedback posting (falls back to the admin token); never logged
    feedback_token: str | None = None
    admin_token: str | None = None

    @field_validator("upstreams", mode="before")
    @classmethod
    def _split_upstreams(cls, value: object) -> object:
        if isinstance(value, str):
            return [u for u in value.split(",") if u.strip()]
        return value

    @field_validator("upstreams")
    @classmethod
    def _normalise_upstreams(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one upstream is required")
        out = []
        for url in value:
            url = url.strip().rstrip("/")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream must be an http(s) URL: {url!r}")
            out.append(url)
        return out

    @field_validator("stream_tools_mode")
    @classmethod
    def _check_mode(cls, value: str) -> str:
        if value not in ("auto", "stream", "buffer"):
            raise ValueError("stream_tools_mode must be auto, stream or buffer")
        return value

    @field_validator("log_fsync_interval")
    @classmethod
    def _check_fsync_interval(cls, value: float) -> float:
        if not 0 < value <= 60:
            raise ValueError("log_fsync_interval must be more than 0 and at most 60 seconds")
        return value

    @field_validator("hosted_tools")
    @classmethod
    def _check_hosted_tools(cls, value: str) -> str:
        if value not in HOSTED_TOOL_MODES:
            raise ValueError("hosted_tools must be omit or refuse")
        return value

    @field_validator("fanout")
    @classmethod
    def _check_fanout(cls, value: int) -> int:
        if value < 1:
            raise ValueError("fanout must be at least 1 (1 = off)")
        return value

    @property
    def keys_required(self) -> bool:
        """Every call needs a client key: always off loopback, on loopback when asked."""
        return self.require_keys or not is_loopback(self.host)

    def check_exposure(self) -> None:
        """Refuse to serve on a non-loopback address without an admin token: the admin API
        can roll back the served model. Checked when the proxy starts, not for every
        command (containers set ONTHEJOB_HOST=0.0.0.0 for all of them)."""
        if not self.admin_token and not is_loopback(self.host):
            raise ValueError(
                f"binding to {self.host} (not a loopback address) needs an admin token: "
                "set ONTHEJOB_ADMIN_TOKEN"
            )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
