"""The serving replicas a publisher swaps, and how it talks to them.

Every publisher (learner/swap/full_publisher.py, learner/swap/lora_publisher.py) holds one
`Replicas`: the vLLM dev-mode calls it makes on each replica (pause, resume, reload, prefix
cache reset, version label, abort), each retried on 5xx answers and transport errors (all
are idempotent) and never on a 4xx (our bug); and the verification of a replica: its weights
checked exactly where it can answer (learner/swap/weight_check.py), then the probe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    HALF_PRECISION_CHECKED_TOLERANCE,
    HALF_PRECISION_TOLERANCE,
    WEIGHT_CHECK_EXTENSION,
    ExpectedLogprobs,
    Fingerprint,
    Probe,
    PublishError,
    PublishResult,
    abs_diff,
    checked,
    checked_tolerance,
    json_object,
    prompt_logprobs,
    served_model,
)

log = logging.getLogger("onthejob.learner")


class Replicas:
    """``upstreams``' base URLs; ``probe`` and ``tolerance``: what a new version's probe
    scores and within what; ``retries``: extra attempts after the first; ``check_weights``:
    True, every replica's weights are compared with the checkpoint's and one that cannot
    answer fails; None, where the replica can answer; False, never.
    ``checked_probe_tolerance``: the probe's tolerance on a half-precision replica whose
    weights were just found equal to the checkpoint's (None: the probe's own)."""

    def __init__(
        self,
        upstreams: list[str],
        *,
        probe: Probe,
        tolerance: float = DEFAULT_TOLERANCE,
        timeout: float = 60,
        retries: int = 3,
        check_weights: bool | None = None,
        checked_probe_tolerance: float | None = HALF_PRECISION_CHECKED_TOLERANCE,
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.probe = probe
        self.tolerance = tolerance
        self.timeout = timeout
        self.retries = retries
        self.check_weights = check_weights
        self.checked_probe_tolerance = checked_probe_tolerance

    def client(self) -> httpx.Client:
        # A fresh connection per call: vLLM (uvicorn) closes the connection after a 500, and
        # the next call on a pooled one then fails with a ReadError.
        return httpx.Client(timeout=self.timeout, headers={"Connection": "close"})

    def reference(self, expected: ExpectedLogprobs) -> Fingerprint:
        """The probe as the trainer's weights score it: what every replica must match."""
        return Fingerprint.of(self.probe, expected, self.tolerance)

    # -- the calls ------------------------------------------------------------------------
    def call(
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
                    return checked(response)
            except httpx.TransportError:
                if attempt >= retries:
                    raise
            time.sleep(min(0.25 * 2**attempt, 4.0))
            attempt += 1

    def pause(self, client: httpx.Client, upstream: str) -> None:
        # "keep" freezes what still runs (nothing a proxy sent: the fence drained those)
        self.call(client, "POST", upstream + "/pause", params={"mode": "keep"})

    def resume(self, client: httpx.Client, upstream: str, retries: int) -> None:
        self.call(client, "POST", upstream + "/resume", retries=retries)

    def abort(self, client: httpx.Client, upstreams: Sequence[str]) -> None:
        for upstream in upstreams:
            self.call(client, "POST", upstream + "/abort_requests", json={})

    def reload(
        self, client: httpx.Client, upstream: str, directory: Path, retries: int | None = None
    ) -> None:
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(directory)}}
        self.call(client, "POST", upstream + "/collective_rpc", json=rpc, retries=retries)

    def reset_prefix_cache(self, client: httpx.Client, upstream: str) -> None:
        # Cached KV blocks were computed by the old weights. Frozen requests hold blocks,
        # so preempt them too (they recompute on the new weights), else the reset fails.
        params = {"reset_running_requests": "true"}
        answer = self.call(client, "POST", upstream + "/reset_prefix_cache", params=params)
        if json_object(answer).get("success") is not True:
            raise PublishError(f"{upstream}: prefix cache not reset: {answer.text[:200]}")

    def label(self, client: httpx.Client, upstream: str, version: str) -> None:
        body = {"new_version": version}
        self.call(client, "POST", upstream + "/update_weight_version", json=body)

    # -- verification ---------------------------------------------------------------------
    def verify_all(
        self,
        client: httpx.Client,
        reference: Fingerprint,
        result: PublishResult | None,
        weights: Any,
        model: str | None = None,
        *,
        require: bool | None = None,
        upstreams: Sequence[str] | None = None,
    ) -> None:
        """Verify every replica (or those of ``upstreams``): its weights against ``weights``
        (the checkpoint side of the weight check, learner.swap.weight_check.Reference; None:
        not checked), then the probe against ``reference``. ``require`` (default: whether
        weights must be checked): a replica that cannot answer the weight check fails; else
        the probe alone verifies it."""
        require = self.check_weights is True if require is None else require
        for upstream in self.upstreams if upstreams is None else upstreams:
            self.verify(client, upstream, reference, weights, result, model, require=require)

    def verify(
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
        """One replica, as `verify_all` says."""
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
        diff = self.probe_diff(client, upstream, reference, model)
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

    def probe_diff(
        self,
        client: httpx.Client,
        upstream: str,
        reference: Fingerprint,
        model: str | None = None,
    ) -> float:
        """Score the probe on one replica (as ``model``, else the base model it serves);
        max |vLLM logprob - reference logprob|."""
        if model is None:
            model = served_model(json_object(self.call(client, "GET", upstream + "/v1/models")))
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
        answer = self.call(client, "POST", upstream + "/v1/completions", json=body)
        served = prompt_logprobs(json_object(answer), reference.token_ids)
        pairs = zip(served, reference.logprobs, strict=True)
        return max((abs_diff(a, b) for a, b in pairs), default=0.0)

    def score(self, upstream: str, reference: Fingerprint, model: str | None = None) -> float:
        """Max |logprob difference| of one replica on ``reference``'s tokens, as served now."""
        with self.client() as client:
            return self.probe_diff(client, upstream.rstrip("/"), reference, model)
