"""Proxy configuration: one Settings object, built by the CLI (flags) or from ONTHEJOB_* env."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from store.settings_fields import setting
from store.url import DEFAULT_SQLITE_URL


class Settings(BaseSettings):
    """`onthejob serve`'s settings: flags (generated from these fields, cli/flags.py)
    over ONTHEJOB_<NAME> environment variables over the defaults."""

    model_config = SettingsConfigDict(env_prefix="ONTHEJOB_", extra="ignore")

    upstreams: Annotated[list[str], NoDecode] = setting(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        help="vLLM OpenAI server base URL; repeat for replicas (environment: comma-separated)",
        flag="--upstream",
        metavar="URL",
        repeat=True,
    )
    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8080, "port to bind")
    database_url: str = setting(
        DEFAULT_SQLITE_URL,
        "database URL (postgresql://... or sqlite:///file.db, relative to the working directory)",
        flag="--db",
        metavar="URL",
    )
    spool_path: Path = setting(
        Path("onthejob-spool.jsonl"),
        "base path of the call log FILE.d/ (every answered call, until it is in the "
        "database) and of FILE.rejected (rows the database refused)",
        flag="--spool",
        metavar="FILE",
    )
    log_fsync_interval: float = setting(
        0.1,
        "fsync the call log this often: what a crash of the whole machine can lose (a kill "
        "of the proxy loses nothing); more than 0, at most 60",
        metavar="SECONDS",
    )
    log_segment_bytes: int = setting(
        64 << 20, "a call log segment file is closed at this size", metavar="BYTES"
    )
    idle_timeout: float = setting(
        300.0, "a trajectory with no call for this long is finished", metavar="SECONDS"
    )
    answered_idle_timeout: float = setting(
        15.0,
        "a trajectory whose last call ended with an answer (no tool call pending) is "
        "finished after this long without a call (at most --idle-timeout): single calls "
        "reach the learner within seconds; raise it where people's next messages, slower "
        "than that, should stay in the same trajectory (next-turn signals)",
        metavar="SECONDS",
    )
    max_body_bytes: int = setting(
        32 * 1024 * 1024, "largest request body accepted", metavar="BYTES"
    )
    upstream_connect_timeout: float = setting(5.0, "to connect to a replica", metavar="SECONDS")
    upstream_timeout: float = setting(
        600.0, "one whole upstream call (generation can be long)", metavar="SECONDS"
    )
    upstream_api_key: str | None = setting(
        None,
        "sent upstream instead of the client's Authorization header (environment only: a "
        "flag would show it in the process list)",
        cli=False,
    )
    policy_poll_interval: float = setting(
        1.0, "how often each replica's served policy version is read", metavar="SECONDS"
    )
    gate_poll_interval: float = setting(
        0.25,
        "how often the swap gates are read from the store (proxy/upstream/gates.py)",
        metavar="SECONDS",
    )
    gate_wait: float = setting(
        60.0,
        "how long a request waits for a replica gated by a swap before it is answered 503",
        metavar="SECONDS",
    )
    flush_interval: float = setting(
        0.05, "how often the writer moves recorded calls into the database", metavar="SECONDS"
    )
    flush_batch_size: int = setting(
        500, "the writer's batch: the calls it holds in memory at most", metavar="N"
    )
    flush_batch_bytes: int = setting(
        8 << 20, "the writer's batch: the bytes it holds in memory at most", metavar="BYTES"
    )
    upstream_retry_after: float = setting(
        1.0,
        "a replica that failed is probed again after this long, doubling with each further "
        "failure up to 30 s",
        metavar="SECONDS",
    )
    stream_tools_mode: Literal["auto", "stream", "buffer"] = setting(
        "auto",
        "streaming requests with tools: stream them (stream), answer them from a whole "
        "upstream response re-emitted as a stream (buffer), or stream until an upstream is "
        "seen dropping tool-call token ids (auto)",
    )
    auto_migrate: bool = setting(
        True, "a new SQLite file, never migrated, gets its schema at start"
    )
    migrate: bool = setting(
        False,
        "upgrade the database schema at start; without it a schema that is behind "
        "(PostgreSQL or SQLite) stops the proxy with what to run (`onthejob db upgrade`)",
    )
    fanout: int = setting(
        1,
        "sample single-turn chat requests N times upstream, answer with the first and "
        "record all N as one GRPO group (1 = off)",
        metavar="N",
    )
    hosted_tools: Literal["omit", "refuse"] = setting(
        "omit",
        "Messages/Responses tools the served model cannot be given (web search, file "
        "search, computer use, code interpreter, vendor-run MCP, ...): leave them out and "
        "record it (omit) or answer with a 400 (refuse)",
    )
    require_keys: bool = setting(
        False,
        "require a client key on every call on loopback too (e.g. behind a reverse proxy on "
        "this host); off loopback they are always required. Keys: POST /admin/api/keys",
    )
    key_poll_interval: float = setting(
        1.0,
        "client keys made or revoked through another proxy take effect here within this long",
        metavar="SECONDS",
    )
    tokenizer: Path | None = setting(
        None,
        "the served model's directory (or its tokenizer.json): the dashboard's token view "
        "reads token texts from it instead of asking vLLM, so they show while vLLM is down",
        metavar="DIR",
    )
    feedback_token: str | None = setting(
        None,
        "bearer token for posting feedback (else the admin token); environment only, never logged",
        cli=False,
    )
    admin_token: str | None = setting(
        None, "bearer token of the admin API and dashboard; environment only", cli=False
    )
    # a teacher: a stronger upstream that answers chosen traffic instead of the served
    # policy (proxy/upstream/teacher.py); its calls are recorded with `teacher` set
    teacher_url: str | None = setting(
        None,
        "an OpenAI-compatible base URL (another vLLM serving a bigger model, or a hosted "
        "API) that answers the traffic --teacher-keys and --teacher-share choose; its calls "
        "are recorded as usual, marked with the teacher, for the learner's supervised stage",
        metavar="URL",
    )
    teacher_model: str | None = setting(
        None,
        "the model name sent to the teacher (required with --teacher-url); recorded on its "
        "calls as `teacher`",
        metavar="NAME",
    )
    # SecretStr: masked in the settings' repr and in validation errors
    teacher_api_key: SecretStr | None = setting(
        None,
        "sent to the teacher as its bearer token (environment only: never logged, stored or "
        "sent elsewhere); unset: the teacher gets no Authorization header",
        cli=False,
    )
    teacher_keys: Annotated[list[str], NoDecode] = setting(
        default_factory=list,
        help="the names of the client keys whose calls the teacher answers; repeat for "
        "several (environment: comma-separated)",
        flag="--teacher-key",
        metavar="NAME",
        repeat=True,
    )
    teacher_share: float = setting(
        0.0,
        "the share of conversations (by conversation key: a conversation never changes side) "
        "the teacher answers, besides --teacher-key's; 0 to 1",
        metavar="FRACTION",
    )
    teacher_hosted: bool = setting(
        False,
        "the teacher is a hosted API, not vLLM: vLLM's own request fields (token ids, chat "
        "template arguments) are left out, and its calls are recorded with text, no tokens",
    )

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

    @field_validator("teacher_keys", mode="before")
    @classmethod
    def _split_teacher_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("teacher_url")
    @classmethod
    def _normalise_teacher_url(cls, value: str | None) -> str | None:
        # checked in check_teacher: a validation error here would echo the URL
        if value is None:
            return None
        url = value.strip().rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    @field_validator("teacher_share")
    @classmethod
    def _check_teacher_share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("teacher_share must be between 0 and 1")
        return value

    @field_validator("tokenizer")
    @classmethod
    def _check_tokenizer(cls, value: Path | None) -> Path | None:
        found = value is None or value.is_file() or (value / "tokenizer.json").is_file()
        if not found:
            raise ValueError(f"no tokenizer.json at {value} (give a model directory or the file)")
        return value

    @field_validator("log_fsync_interval")
    @classmethod
    def _check_fsync_interval(cls, value: float) -> float:
        if not 0 < value <= 60:
            raise ValueError("log_fsync_interval must be more than 0 and at most 60 seconds")
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

    def check_teacher(self) -> None:
        """The teacher's settings hang together (checked when the app is made, not by a
        model validator: pydantic's errors echo every input, the teacher's key included)."""
        routed = bool(self.teacher_keys) or self.teacher_share > 0
        if self.teacher_url is None:
            if routed or self.teacher_model is not None:
                raise ValueError(
                    "--teacher-key, --teacher-share and --teacher-model need --teacher-url"
                )
            return
        parts = urlsplit(self.teacher_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("--teacher-url must be an http(s) URL")
        if parts.username is not None or parts.password is not None:
            # the URL is logged and recorded on every teacher call
            raise ValueError(
                "--teacher-url must not hold credentials: set ONTHEJOB_TEACHER_API_KEY instead"
            )
        if not self.teacher_model:
            raise ValueError("--teacher-url needs --teacher-model: the model name to send it")
        if not routed:
            raise ValueError(
                "--teacher-url answers nothing without --teacher-key or --teacher-share"
            )

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
