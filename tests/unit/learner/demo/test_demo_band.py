"""The demo's check before learning: held-out success outside the learnable band stops it
with a reason, unless --no-band-check says go on."""

from __future__ import annotations

import pytest

from learner.demo.report import EvalPoint
from learner.demo.run import LEARNABLE_BAND, DemoConfig, DemoStopped, _check_band


def point(rate: float) -> EvalPoint:
    return EvalPoint("before", None, rate, 150)


def test_inside_the_band_goes_on() -> None:
    low, high = LEARNABLE_BAND
    for rate in (low, (low + high) / 2, high):
        _check_band(point(rate), DemoConfig())


@pytest.mark.parametrize(
    ("rate", "reason"), [(0.03, "too low for the learner"), (0.5, "too high to double")]
)
def test_outside_the_band_stops_with_the_reason(rate: float, reason: str) -> None:
    with pytest.raises(DemoStopped, match=reason):
        _check_band(point(rate), DemoConfig())
    _check_band(point(rate), DemoConfig(band_check=False))  # --no-band-check goes on
