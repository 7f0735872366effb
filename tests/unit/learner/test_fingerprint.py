"""A stored probe checked against replicas whose dtype changed since it was recorded."""

from __future__ import annotations

from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    FLOAT32_CHECKED_TOLERANCE,
    HALF_PRECISION_CHECKED_TOLERANCE,
    HALF_PRECISION_TOLERANCE,
    Fingerprint,
    checked_tolerance,
    tolerance_for,
)

STORED = {"token_ids": [1, 2, 3], "logprobs": [-0.5, -1.25, -2.0], "tolerance": DEFAULT_TOLERANCE}


def test_a_float32_probe_is_widened_to_what_a_bf16_replica_needs() -> None:
    # a version published while vLLM served float32, restored after vLLM moved to bf16:
    # the right weights differ by more than 1e-3 there, and a restart must not crash-loop
    fingerprint = Fingerprint.from_state(STORED, at_least=tolerance_for("bfloat16"))
    assert fingerprint is not None
    assert fingerprint.tolerance == HALF_PRECISION_TOLERANCE
    assert fingerprint.token_ids == [1, 2, 3] and fingerprint.logprobs == [-0.5, -1.25, -2.0]


def test_at_least_never_tightens_a_stored_tolerance() -> None:
    wide = {**STORED, "tolerance": HALF_PRECISION_TOLERANCE}
    fingerprint = Fingerprint.from_state(wide, at_least=tolerance_for("float32"))
    assert fingerprint is not None and fingerprint.tolerance == HALF_PRECISION_TOLERANCE


def test_an_explicit_tolerance_replaces_the_stored_one_but_not_below_the_floor() -> None:
    replaced = Fingerprint.from_state(STORED, 5e-2)
    assert replaced is not None and replaced.tolerance == 5e-2
    floored = Fingerprint.from_state(STORED, 1e-4, at_least=DEFAULT_TOLERANCE)
    assert floored is not None and floored.tolerance == DEFAULT_TOLERANCE


def test_a_version_without_a_stored_probe_has_no_fingerprint() -> None:
    assert Fingerprint.from_state(None, at_least=HALF_PRECISION_TOLERANCE) is None
    assert Fingerprint.from_state({"token_ids": [1]}, at_least=1.0) is None


def test_weights_checked_exactly_loosen_the_probe_by_dtype_never_past_the_callers_bound() -> None:
    half = HALF_PRECISION_CHECKED_TOLERANCE
    assert checked_tolerance("bfloat16", half) == half == 1.0
    # float32 kernels round like the trainer's, by an amount that grows with the logits
    assert checked_tolerance("float32", half) == FLOAT32_CHECKED_TOLERANCE == 1e-2
    assert checked_tolerance("float32", 5e-3) == 5e-3
    assert checked_tolerance(None, half) == FLOAT32_CHECKED_TOLERANCE
