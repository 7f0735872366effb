"""The settings of the learner's canaries (learner/canary/settings.py): the learner's flags,
each a tenant sets replaced by the tenant's; the watch's thresholds the code's, each a
tenant sets replaced; and the admin API's model of a tenant's settings names exactly the
watch's thresholds and keeps only what is set."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from pydantic import ValidationError

from learner.canary.settings import canary_settings, watch_thresholds
from learner.canary.watch import Thresholds
from learner.config import LearnerConfig
from proxy.admin.schemas import TenantCanaryIn, WatchThresholdsIn
from store.tenants import CanaryOverrides


def config(**settings: object) -> LearnerConfig:
    return LearnerConfig(model="m", **settings)  # type: ignore[arg-type]


def test_off_by_default_and_the_learner_s_flags_apply_to_every_scope() -> None:
    off = canary_settings(config(), "support", None)
    assert not off.on and off.share == 0.0
    assert (off.min_calls, off.time_limit, off.default_decision) == (
        100,
        timedelta(hours=24),
        "rollback",
    )
    learner = config(
        canary_share=0.2, canary_min_calls=40, canary_time_limit=600, canary_default="promote"
    )
    for tenant in (None, "support"):
        got = canary_settings(learner, tenant, None)
        assert got.on and got.share == 0.2
        assert (got.min_calls, got.time_limit, got.default_decision) == (
            40,
            timedelta(seconds=600),
            "promote",
        )
        assert got.source == "the learner's settings"


def test_a_tenant_s_own_settings_override_the_learner_s_one_by_one() -> None:
    learner = config(canary_share=0.2, canary_min_calls=40)
    own: CanaryOverrides = {"share": 0.5, "default_decision": "promote"}
    got = canary_settings(learner, "support", own)
    assert (got.share, got.min_calls, got.default_decision) == (0.5, 40, "promote")
    assert got.time_limit == timedelta(hours=24)
    assert got.source == "tenant support's share, default_decision, else the learner's"
    assert "share 0.5" in got.summary() and "then promote" in got.summary()
    # a tenant turns canaries on where the learner's are off, and off where they are on
    assert canary_settings(config(), "support", {"share": 0.3}).on
    assert not canary_settings(learner, "support", {"share": 0.0}).on
    # settings of its watch alone leave the learner's canary settings
    assert canary_settings(learner, "support", {"watch": {"min_trajectories": 5}}).source == (
        "the learner's settings"
    )


def test_the_watch_s_thresholds_are_the_code_s_but_for_what_a_tenant_sets() -> None:
    assert watch_thresholds(None) == Thresholds()
    assert watch_thresholds({"share": 0.1}) == Thresholds()
    got = watch_thresholds({"watch": {"min_trajectories": 20.0, "length_high": 3}})
    assert got == dataclasses.replace(Thresholds(), min_trajectories=20, length_high=3.0)
    assert isinstance(got.min_trajectories, int) and isinstance(got.length_high, float)
    # a name the watch does not know (a stored row from elsewhere) is left out
    assert watch_thresholds({"watch": {"no_such_threshold": 1.0}}) == Thresholds()


def test_the_admin_api_names_the_watch_s_thresholds_and_keeps_only_what_is_set() -> None:
    assert set(WatchThresholdsIn.model_fields) == {f.name for f in dataclasses.fields(Thresholds)}
    assert TenantCanaryIn().overrides() == {}
    assert TenantCanaryIn(watch=WatchThresholdsIn()).overrides() == {}
    body = TenantCanaryIn.model_validate(
        {"share": 0.25, "min_calls": 30, "watch": {"share_rise": 0.1}}
    )
    assert body.overrides() == {"share": 0.25, "min_calls": 30, "watch": {"share_rise": 0.1}}
    for wrong in ({"share": 1.0}, {"min_calls": 0}, {"watch": {"length_low": 2.0}}, {"x": 1}):
        with pytest.raises(ValidationError):
            TenantCanaryIn.model_validate(wrong)


def test_the_learner_s_share_is_below_one() -> None:
    with pytest.raises(ValidationError):
        config(canary_share=1.0)
