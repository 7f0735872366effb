"""proxy/upstream/canaries.py's replica preference: a full-weight candidate's arm goes to the
replicas serving it, every other call to the others; nothing changes for adapters."""

from __future__ import annotations

from sqlalchemy import create_engine

from proxy.upstream.canaries import CanaryTable
from proxy.upstream.replicas import UpstreamPool
from store.canaries import CanaryRule


def table(versions: dict[str, str | None], rules: list[CanaryRule]) -> CanaryTable:
    """A table over replicas serving `versions` (url -> policy version), with `rules`."""
    pool = UpstreamPool(list(versions), connect_timeout=1, total_timeout=1, retry_after=1)
    for replica in pool.replicas:
        replica.policy_version = versions[replica.url]
    canaries = CanaryTable(create_engine("sqlite://"), pool, poll_interval=60)
    canaries._install(rules)
    return canaries


def preferred(canaries: CanaryTable, candidate: str | None) -> list[str] | None:
    prefer = canaries.replica_preference(candidate)
    return None if prefer is None else [r.url for r in canaries.pool.replicas if prefer(r)]


SHARED = CanaryRule(id=1, tenant=None, candidate="step-9", share=0.25)


def test_a_full_weight_candidate_s_arm_goes_to_its_replicas_and_the_rest_to_the_others() -> None:
    canaries = table({"http://a": "step-8", "http://b": "step-9", "http://c": "step-8"}, [SHARED])
    assert preferred(canaries, "step-9") == ["http://b"]
    assert preferred(canaries, None) == ["http://a", "http://c"]  # the incumbent's arm
    # a tenant's adapter canary meanwhile: its calls stay off the full-weight candidate too
    assert preferred(canaries, "tenant-a-step-3") == ["http://a", "http://c"]


def test_no_preference_without_a_canary_or_for_an_adapter_candidate() -> None:
    assert preferred(table({"http://a": "step-8", "http://b": "step-8"}, []), None) is None
    adapter = CanaryRule(id=2, tenant="a", candidate="a-step-3", share=0.5)
    canaries = table({"http://a": "step-8", "http://b": "step-8"}, [adapter])
    assert preferred(canaries, "a-step-3") is None  # loaded beside: any replica with it
    assert preferred(canaries, None) is None
