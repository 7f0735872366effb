"""The vLLM replicas behind the proxy: choice, health, and the policy version each serves.

Requests are spread over healthy replicas by rendezvous hashing on a sticky key (session or
conversation), so a conversation keeps hitting the replica holding its prefix cache and
only the conversations of a lost replica move. A replica that cannot be connected to is
taken out and tried again after a back-off; a request whose replica refused or dropped the
connection before answering moves on to the next replica, so the client never sees that.

A replica whose swap gate is closed (proxy/upstream/gates.py: its weights are being swapped and
verified) gets nothing: requests go to the other replicas, or wait for one to open. Every
request sent is counted in flight on its replica until its response is released, which is
how the gate knows when the replica is drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
import orjson

from proxy.base.errors import UpstreamBusy, UpstreamTimeout, UpstreamUnavailable
from proxy.upstream import http1, sampling
from store.json_types import JsonObject

log = logging.getLogger("onthejob.upstream")
# how long a replica whose sampling defaults cannot be learned waits to be asked again
DEFAULTS_RETRY = 30.0
# what reading an upstream answer may raise once its status line has arrived
UPSTREAM_READ_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError)


@dataclass
class Replica:
    url: str
    healthy: bool = True
    retry_at: float = 0.0
    failures: int = 0
    policy_version: str | None = None
    # the LoRA adapter the policy version is (None: full weights), and the base model
    # names it stands in for: clients keep asking for the base, the adapter answers
    adapter: str | None = None
    base_models: frozenset[str] = frozenset()
    # every LoRA adapter it has loaded, as last read (tenants' calls go to theirs)
    adapters: frozenset[str] = frozenset()
    # learned: this replica's streamed tool calls come without their token ids
    drops_stream_tool_tokens: bool = False
    # the epoch of its closed swap gate (None: open), and requests sent, not yet released
    gate_epoch: int | None = None
    in_flight: int = 0
    # the sampling parameters it applies where a request sets none (proxy/upstream/sampling.py);
    # None: unknown (calls record no effective sampling), and where they came from or why
    sampling_defaults: JsonObject | None = None  # vLLM's, by parameter
    sampling_source: str | None = None
    defaults_asked_at: float | None = None

    def eligible(self, now: float) -> bool:
        return self.healthy or now >= self.retry_at

    def serve_as(self, requested: object, tenant_adapter: str | None = None) -> str | None:
        """The adapter to send a request for ``requested`` to, if it is not the model itself:
        the tenant's, where this replica has it loaded, else the policy version's."""
        if requested not in self.base_models:
            return None
        if tenant_adapter is not None and tenant_adapter in self.adapters:
            return tenant_adapter
        return self.adapter


def _score(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{key}\x00{url}".encode(), digest_size=8).digest()


class UpstreamPool:
    def __init__(
        self,
        urls: list[str],
        *,
        connect_timeout: float,
        total_timeout: float,
        retry_after: float,
        api_key: str | None = None,
        gate_wait: float = 60.0,
        learn_sampling: bool = True,
    ) -> None:
        self.replicas = [Replica(url) for url in urls]
        self._connect_timeout = connect_timeout
        self._total_timeout = total_timeout
        self._retry_after = retry_after
        self._api_key = api_key
        self._gate_wait = gate_wait
        # False: never ask the replicas for sampling defaults (a teacher: none may be vLLM)
        self._learn_sampling_defaults = learn_sampling
        self._round_robin = itertools.count()
        self._session: aiohttp.ClientSession | None = None  # the proxy's own calls
        self._client: http1.Client | None = None  # calls made for clients: the hot path
        self._sent: dict[int, Replica] = {}  # id(response) -> the replica it is in flight on
        self._gate_opened = asyncio.Event()
        self.drained = asyncio.Event()  # set when a gated replica's last request ends
        # one question for sampling defaults at a time per replica (`_know_defaults`)
        self._defaults_asked: dict[str, asyncio.Lock] = {}
        # the adapters calls go to, by who wants them (the tenants, the canaries): while any
        # is wanted, each poll reads which adapters every replica has loaded
        self._wanted: dict[str, frozenset[str]] = {}

    def want_adapters(self, who: str, names: frozenset[str]) -> None:
        """The adapters `who` sends calls to (replacing what it wanted before)."""
        self._wanted[who] = names

    @property
    def wanted_adapters(self) -> frozenset[str]:
        return frozenset().union(*self._wanted.values())

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=0,
            ttl_dns_cache=300,
            enable_cleanup_closed=True,
            # below uvicorn's (vLLM's server) 5 s: we drop an idle connection before it does,
            # so a request is rarely sent on one the server is closing
            keepalive_timeout=4.0,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=self._total_timeout,
                sock_connect=self._connect_timeout,
            ),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self._client = http1.Client(
            connect_timeout=self._connect_timeout,
            total_timeout=self._total_timeout,
            keepalive=4.0,  # as the connector's, for the same reason
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "UpstreamPool.start() not called"
        return self._session

    def candidates(
        self, sticky_key: str | None, prefer: Callable[[Replica], bool] | None = None
    ) -> list[Replica]:
        """Replicas in the order to try: the sticky one first, unhealthy ones last, gated
        ones never; with `prefer`, the replicas it prefers before the others in each of the
        two (a canary's arm: proxy/upstream/canaries.py)."""
        open_ = [r for r in self.replicas if r.gate_epoch is None]
        if len(open_) <= 1:
            return open_
        now = time.monotonic()
        if sticky_key is not None:
            ordered = sorted(open_, key=lambda r: _score(sticky_key, r.url), reverse=True)
        else:
            start = next(self._round_robin) % len(open_)
            ordered = open_[start:] + open_[:start]
        usable = [r for r in ordered if r.eligible(now)]
        resting = [r for r in ordered if not r.eligible(now)]
        if prefer is None:
            return usable + resting
        # stable sorts: the preferred first, each side in the order above
        return sorted(usable, key=lambda r: not prefer(r)) + sorted(
            resting, key=lambda r: not prefer(r)
        )

    # -- swap gates (driven by proxy/upstream/gates.py) -------------------------------------------
    def close_gate(self, replica: Replica, epoch: int) -> None:
        if replica.gate_epoch is None:
            log.info("upstream %s: swap gate closed, holding its traffic", replica.url)
        replica.gate_epoch = epoch

    def open_gate(self, replica: Replica, version: str | None) -> None:
        """Traffic flows again; what it records as served by this replica is `version`."""
        if replica.gate_epoch is None:
            return
        replica.gate_epoch = None
        if version is not None and version != replica.policy_version:
            # a full reload: the replica serves its base weights, no adapter
            replica.policy_version, replica.adapter = version, None
        log.info("upstream %s: swap gate open, serving %s", replica.url, replica.policy_version)
        self._gate_opened.set()
        self._gate_opened = asyncio.Event()

    def drained_epochs(self) -> dict[str, int]:
        """{url: epoch} of the gated replicas with nothing in flight any more."""
        return {
            r.url: r.gate_epoch
            for r in self.replicas
            if r.gate_epoch is not None and r.in_flight == 0
        }

    async def _open_replicas(
        self, sticky_key: str | None, prefer: Callable[[Replica], bool] | None = None
    ) -> list[Replica]:
        """The candidates; while every replica is gated, wait (bounded) for one to open."""
        deadline = time.monotonic() + self._gate_wait
        while not (found := self.candidates(sticky_key, prefer)):
            left = deadline - time.monotonic()
            if left <= 0:
                raise UpstreamBusy(
                    f"every upstream is held for a weight swap for more than "
                    f"{self._gate_wait:g}s; try again later"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._gate_opened.wait(), timeout=left)
        return found

    def mark_failed(self, replica: Replica) -> None:
        replica.failures += 1
        replica.healthy = False
        # it may come back restarted with other defaults: learned again before they count
        replica.sampling_defaults = replica.sampling_source = replica.defaults_asked_at = None
        backoff = min(self._retry_after * 2 ** (replica.failures - 1), 30.0)
        replica.retry_at = time.monotonic() + backoff
        log.warning("upstream %s unreachable; retrying it in %.1fs", replica.url, backoff)

    def mark_ok(self, replica: Replica) -> None:
        if not replica.healthy:
            log.info("upstream %s is back", replica.url)
        replica.healthy = True
        replica.failures = 0

    def headers(self, client_headers: Mapping[str, str]) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif "authorization" in client_headers:
            headers["Authorization"] = client_headers["authorization"]
        elif "x-api-key" in client_headers:  # Anthropic clients; vLLM's --api-key is bearer
            headers["Authorization"] = f"Bearer {client_headers['x-api-key']}"
        elif "x-goog-api-key" in client_headers:  # Gemini clients
            headers["Authorization"] = f"Bearer {client_headers['x-goog-api-key']}"
        return headers

    async def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | Callable[[Replica], bytes] | None,
        headers: Mapping[str, str],
        sticky_key: str | None,
        prefer: Callable[[Replica], bool] | None = None,
    ) -> tuple[Replica, http1.Response]:
        """Send a request to the first replica that answers it (those `prefer` prefers
        first, see `candidates`).

        The caller must release the response. A replica that refuses the connection, or
        drops it before any response byte, is marked down and the next one is tried: a
        generation has no side effects, so the worst a retry costs is the compute of a
        half-started answer on a replica that is going away. A kept-alive connection to a
        replica that died since is the common case, and the client must not see it.
        ``body`` may depend on the replica (the LoRA adapter it serves).
        """
        failures: list[str] = []
        for replica in await self._open_replicas(sticky_key, prefer):
            if replica.sampling_defaults is None:  # no coroutine on the hot path
                await self._know_defaults(replica)
            # a dropped connection is tried once more on the same replica: it may have been
            # a kept-alive one the server closed as we sent (the next one is fresh)
            for attempt in range(2):
                if replica.gate_epoch is not None:
                    break  # gated while we tried another: it gets nothing new
                try:
                    response = await self._counted_send(replica, method, path, body, headers)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                    if isinstance(exc, _CONNECT_ERRORS) or attempt == 1:
                        self.mark_failed(replica)
                        failures.append(f"{replica.url} ({_failure(exc)})")
                        break
                    continue
                except aiohttp.ConnectionTimeoutError as exc:
                    self.mark_failed(replica)
                    failures.append(f"{replica.url} ({_failure(exc)})")
                    break
                except TimeoutError as exc:
                    raise UpstreamTimeout(f"upstream {replica.url} timed out") from exc
                except aiohttp.ClientError as exc:
                    raise UpstreamUnavailable(f"upstream {replica.url} failed: {exc}") from exc
                self.mark_ok(replica)
                self._sent[id(response)] = replica
                return replica, response
        raise UpstreamUnavailable(f"no upstream reachable: tried {'; '.join(failures)}")

    async def _counted_send(
        self,
        replica: Replica,
        method: str,
        path: str,
        body: bytes | Callable[[Replica], bytes] | None,
        headers: Mapping[str, str],
    ) -> http1.Response:
        # in flight from before the first byte leaves until the response is released
        replica.in_flight += 1
        try:
            return await self._send(replica, method, path, body, headers)
        except BaseException:
            self._done(replica)
            raise

    async def release(self, response: http1.Response) -> None:
        """Release a response `open` returned: its request is no longer in flight."""
        await release(response)
        replica = self._sent.pop(id(response), None)
        if replica is not None:
            self._done(replica)

    def _done(self, replica: Replica) -> None:
        replica.in_flight -= 1
        if replica.in_flight == 0 and replica.gate_epoch is not None:
            self.drained.set()

    async def _send(
        self,
        replica: Replica,
        method: str,
        path: str,
        body: bytes | Callable[[Replica], bytes] | None,
        headers: Mapping[str, str],
    ) -> http1.Response:
        assert self._client is not None, "UpstreamPool.start() not called"
        # the path as given: no normalisation of dot segments; no redirects followed
        return await self._client.request(
            method,
            replica.url,
            path,
            body=body(replica) if callable(body) else body,
            headers=headers,
        )

    async def poll(self) -> None:
        """Once: each replica's policy version and sampling defaults; probe those that are out."""
        await asyncio.gather(*(self._poll(r) for r in self.replicas))

    async def watch(self, interval: float) -> None:
        """Forever: `poll`, every `interval` seconds."""
        while True:
            await self.poll()
            await asyncio.sleep(interval)

    async def _poll(self, replica: Replica) -> None:
        timeout = aiohttp.ClientTimeout(total=max(self._connect_timeout, 2.0))
        try:
            async with self.session.get(replica.url + "/weight_info", timeout=timeout) as resp:
                info = orjson.loads(await resp.read()) if resp.status == 200 else None
            version = info.get("weight_version") if isinstance(info, dict) else None
            changed = version is not None and str(version) != replica.policy_version
            # a new version may be a restarted server: its defaults are asked again, first
            if changed or self._defaults_due(replica):
                await self._learn_sampling(replica, timeout)
            if changed:
                await self._follow_version(replica, str(version), timeout)
            elif self.wanted_adapters:
                await self._read_models(replica, timeout)
            if not replica.healthy and replica.eligible(time.monotonic()):
                async with self.session.get(replica.url + "/health", timeout=timeout) as resp:
                    if resp.status == 200:
                        self.mark_ok(replica)
        except aiohttp.ClientConnectorError:
            if replica.healthy:
                self.mark_failed(replica)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            # slow or odd answers from a busy replica are not a reason to route around it
            log.debug("policy version poll of %s failed", replica.url, exc_info=True)

    async def _know_defaults(self, replica: Replica) -> None:
        """A replica whose sampling defaults are unknown (back from a failure: it may have
        restarted with others) is asked for them before it answers a client, not at the
        next poll: a call recorded without its effective sampling is never trained on."""
        if not self._defaults_due(replica):
            return  # the hot path: known, or asked within DEFAULTS_RETRY
        lock = self._defaults_asked.setdefault(replica.url, asyncio.Lock())
        async with lock:
            if not self._defaults_due(replica):
                return  # a request before this one asked
            limit = aiohttp.ClientTimeout(total=max(self._connect_timeout, 2.0))
            try:
                await self._learn_sampling(replica, limit)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                # still down, or odd: the request finds out itself; asked again later
                log.debug("sampling defaults of %s unknown: %r", replica.url, exc)

    def _defaults_due(self, replica: Replica) -> bool:
        if replica.sampling_defaults is not None or not self._learn_sampling_defaults:
            return False
        asked = replica.defaults_asked_at
        return asked is None or time.monotonic() - asked >= DEFAULTS_RETRY

    async def _learn_sampling(self, replica: Replica, limit: aiohttp.ClientTimeout) -> None:
        """Ask the replica for its sampling defaults (transport errors reach the caller)."""
        replica.defaults_asked_at = time.monotonic()
        defaults, source = await sampling.learn_defaults(self.session, replica.url, limit)
        if defaults is None and replica.sampling_source != source:
            log.warning(
                "upstream %s: sampling defaults unknown (%s); its calls are recorded "
                "without effective sampling and are not trained on",
                replica.url,
                source,
            )
        elif defaults is not None and defaults != replica.sampling_defaults:
            log.info("upstream %s samples by default with %s (%s)", replica.url, defaults, source)
        replica.sampling_defaults, replica.sampling_source = defaults, source

    async def _follow_version(
        self, replica: Replica, version: str, limit: aiohttp.ClientTimeout
    ) -> None:
        """Take on a new policy version, and whether it is a LoRA adapter of the replica.

        Version and adapter change together or not at all: a record must never carry a
        version that did not answer it.
        """
        if not await self._read_models(replica, limit):
            return  # asked again at the next poll
        is_adapter = version in replica.adapters
        replica.adapter = version if is_adapter else None
        replica.policy_version = version
        kind = "LoRA adapter" if is_adapter else "policy version"
        log.info("upstream %s serves %s %s", replica.url, kind, version)

    async def _read_models(self, replica: Replica, limit: aiohttp.ClientTimeout) -> bool:
        """Read the replica's base models and loaded adapters; False: its answer was no list."""
        async with self.session.get(replica.url + "/v1/models", timeout=limit) as resp:
            models = orjson.loads(await resp.read()) if resp.status == 200 else None
        if not isinstance(models, dict) or not isinstance(models.get("data"), list):
            return False
        entries = [m for m in models["data"] if isinstance(m, dict)]
        replica.base_models = frozenset(
            str(m.get("id")) for m in entries if m.get("parent") is None
        )
        replica.adapters = frozenset(str(m.get("id")) for m in entries if m.get("parent"))
        return True


# the replica is not there (as opposed to a connection it dropped): taken out at once
_CONNECT_ERRORS = (aiohttp.ClientConnectorError, http1.ConnectError)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, (*_CONNECT_ERRORS, aiohttp.ConnectionTimeoutError)):
        return f"connect: {_reason(exc)}"
    return f"dropped the connection: {_reason(exc)}"


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def release(response: http1.Response | aiohttp.ClientResponse) -> None:
    with contextlib.suppress(Exception):
        response.release()
