"""Serve a recorded policy version again: `onthejob rollback`, and the admin API's rollback
and promote, which a running learner carries out (learner/swap/requests.py).

The version's checkpoint goes back into every replica as a new version
`VERSION+rollback-N` (N its ordinal), so staleness keeps counting forwards and what the
rolled-away versions produced counts as old. A running learner trains on from it. A
tenant's version (learn --tenants) is an adapter that serves that tenant again, by its
pointer: the other tenants and the shared policy are left as they are.

Invariant: under the publish lease (learner/swap/lease.py), fenced like any full reload, and
verified against the probe recorded when the version was first verified, within the
tolerance it was verified with. No model is loaded for it (this module and what it imports
are torch-free); only a version recorded before probes were kept needs `expected_for`,
which the command line provides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from sqlalchemy import Connection, Engine

from learner.layout import served_base
from learner.swap import lease
from learner.swap.fence import Fence
from learner.swap.lora_publisher import LoraPublisher, tenant_pointer
from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    ExpectedLogprobs,
    Fingerprint,
    Probe,
    PublishError,
    PublishResult,
    current_version,
    served_dtype,
    tolerance_for,
)
from store import canaries, clock, policy_versions
from store.policy_versions import UnknownVersion, VersionError
from store.publish_lease import LeaseHolder

__all__ = [
    "PublishFailed",
    "UnknownVersion",
    "VersionError",
    "serve_version",
    "serve_version_held",
]

log = logging.getLogger("onthejob.learner")

ExpectedFor = Callable[[Path], tuple[Probe, ExpectedLogprobs]]
"""Given a checkpoint, the probe and what the trainer computes for it (loads the model)."""


class PublishFailed(VersionError):
    """The verified hot-swap failed: the previous version keeps serving."""

    status = 502


def serve_version(
    engine: Engine,
    upstreams: Sequence[str],
    version: str,
    *,
    action: str = "rollback",
    lease_wait: float = lease.OUTLASTS_TTL,
    expected_for: ExpectedFor | None = None,
    tolerance: float | None = None,
    drain_timeout: float = 60.0,
    on_lease_wait: Callable[[LeaseHolder], None] | None = None,
) -> str:
    """Serve `version` again; the new version's name. `action` "rollback" refuses a version
    newer than the serving one (that is "promote"). `tolerance` only applies to a version
    without a recorded probe (one that has one is verified as it was at first). By default
    it waits out the lease of a publisher killed holding it; `on_lease_wait` hears who holds
    the lease when it has to wait."""
    holder = lease.holder_name(action)
    try:
        with lease.held(engine, holder, wait=lease_wait, on_wait=on_lease_wait):
            return _serve(
                engine,
                list(upstreams),
                version,
                action,
                holder,
                expected_for,
                tolerance,
                drain_timeout,
            )
    except lease.LeaseBusy as exc:
        raise VersionError(str(exc)) from None


def serve_version_held(
    engine: Engine,
    upstreams: Sequence[str],
    version: str,
    holder: str,
    *,
    drain_timeout: float = 60.0,
) -> str:
    """``serve_version`` for a caller that holds the publish lease as ``holder`` already (the
    learner at start-up), as a rollback."""
    return _serve(engine, list(upstreams), version, "rollback", holder, None, None, drain_timeout)


def _serve(
    engine: Engine,
    upstreams: list[str],
    version: str,
    action: str,
    holder: str,
    expected_for: ExpectedFor | None,
    tolerance: float | None,
    drain_timeout: float,
) -> str:
    with engine.connect() as conn:
        target = policy_versions.version(conn, version=version)
        # a tenant's version serves that tenant again, by its pointer (learn --tenants)
        lineage = None if target is None else target.get("tenant")
        current = policy_versions.serving_version(conn, lineage)
        ordinal = policy_versions.next_ordinal(conn)  # ours: nobody else publishes under the lease
    policy_versions.check_servable(target, current, version, action)
    assert target is not None
    checkpoint = Path(target["checkpoint_path"])
    tolerance = _tolerance(upstreams) if tolerance is None else tolerance
    fingerprint = Fingerprint.from_state(target["probe"], at_least=tolerance)
    expected: ExpectedLogprobs | None = None
    probe = None if fingerprint is None else Probe(fingerprint.token_ids)
    if fingerprint is None:
        if expected_for is None:
            raise VersionError(
                f"version {version!r} has no recorded probe (it was published before probes "
                f"were kept): serve it with `onthejob rollback {version}`, which loads the "
                "model to verify it"
            )
        probe, expected = expected_for(checkpoint)
    assert probe is not None
    label = f"{version}+rollback-{ordinal}"
    if action == "promote":
        # a canary's full-weight candidate serves on some replicas already: a failure of
        # this swap does not verify those it did not reach against the incumbent
        candidate_replicas = [u for u in upstreams if _serves(u, version)]
    publisher = LoraPublisher(
        upstreams,
        probe=probe,
        tolerance=tolerance,
        last_good=None if current is None else served_base(Path(current["checkpoint_path"])),
        last_good_fingerprint=(
            None
            if current is None
            else Fingerprint.from_state(current["probe"], at_least=tolerance)
        ),
        # what a replica put back after a failure is named: a canary's candidate replica
        # held other weights under another name before
        last_good_label=None if current is None else current["version"],
        fence=Fence(engine, holder, drain_timeout=drain_timeout),
        # a recorded version's files were checked when it was first published
        check_files=fingerprint is None,
        label=None if lineage is None else tenant_pointer(engine, lineage),
    )
    if action == "promote":
        publisher.full.canary_replicas = candidate_replicas

    def record(result: PublishResult) -> None:
        with engine.begin() as conn:
            policy_versions.add_version(
                conn,
                version=label,
                ordinal=ordinal,
                parent=None if current is None else current["version"],
                checkpoint_path=str(checkpoint),
                status="serving",
                swap_seconds=result.swap_seconds,
                probe=None if result.fingerprint is None else result.fingerprint.state(),
                tenant=lineage,
            )
            if fingerprint is None and result.fingerprint is not None:
                policy_versions.set_version_probe(
                    conn, version=version, probe=result.fingerprint.state()
                )
            if action == "rollback":
                _end_canary(conn, lineage, version)

    result = publisher.rollback(
        checkpoint, label, fingerprint=fingerprint, expected=expected, commit=record
    )
    if not result.ok:
        raise PublishFailed(f"{action} to {version!r} failed: {result.error}")
    if not result.opened:
        raise PublishFailed(f"{action} to {version!r} is recorded, but {result.error}")
    log.info("%s: serving the weights of %s as %s", action, version, label)
    return label


def _serves(upstream: str, version: str) -> bool:
    """Whether the replica reports `version` as its weights' name (False: unreachable)."""
    try:
        return current_version(upstream) == version
    except (httpx.HTTPError, PublishError):
        return False


def _end_canary(conn: Connection, tenant: str | None, version: str) -> None:
    """A rollback serves its scope a version by hand: a canary running for the scope would
    otherwise go on comparing against what no longer serves, and its promotion undo this."""
    running = canaries.running_for(conn, tenant)
    if running is not None:
        canaries.roll_back(
            conn,
            canary_id=running,
            by="rollback",
            reason=f"{version} was served by a rollback while the canary ran",
            now=clock.now(),
        )
        log.info("canary %s rolled back: %s serves its scope by a rollback", running, version)


def _tolerance(upstreams: Sequence[str]) -> float:
    """For a version without a recorded probe: by the dtype the replicas serve in."""
    return max((tolerance_for(served_dtype(u)) for u in upstreams), default=DEFAULT_TOLERANCE)
