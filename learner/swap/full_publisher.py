"""Full-weight swaps: every replica gets the whole model, fenced, verified, or none does.

The protocol (learner/swap/publisher.py says why each part is there): validate the weights
before any replica is touched; close the fence (every proxy holds the replicas' traffic);
then each replica in turn: pause (keep), load, reset the prefix cache, resume; verify every
replica (weights exactly where it can answer, then the probe); record the version
(``commit``); label the replicas; open the fence. A failure at any point puts the last good
weights back where the new ones went, verified against their probe, before the fence opens.

How the weights reach a paused replica is the transport's (`WeightTransport`): `DiskReload`
(vLLM's ``reload_weights`` from the checkpoint directory) by default, or
learner/swap/transfer.py's `WeightFileTransfer` (vLLM's weight-transfer API, from memory).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import httpx

from learner.layout import CheckpointError
from learner.swap.fence import FenceError
from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    HALF_PRECISION_CHECKED_TOLERANCE,
    MUST_SUCCEED_RETRIES,
    Commit,
    ExpectedLogprobs,
    Fence,
    Fingerprint,
    Probe,
    PublishError,
    PublishResult,
    failure_reason,
)
from learner.swap.replicas import Replicas

if TYPE_CHECKING:
    import torch

log = logging.getLogger("onthejob.learner")


class PublisherSettings(TypedDict):
    """What every kind of publisher of a lineage is made with."""

    probe: Probe
    tolerance: float
    last_good: Path
    last_good_fingerprint: Fingerprint | None
    last_good_label: str | None
    fence: Fence
    check_weights: bool
    checked_probe_tolerance: float | None


class WeightTransport(Protocol):
    """How a checkpoint's weights reach one paused replica. Weights that were not staged
    for a directory (a rollback, a restore, a repair) come from its files."""

    def stage(
        self, directory: Path, version: str, tensors: Mapping[str, torch.Tensor] | None
    ) -> None:
        """The publish about to start: ``directory``'s weights as ``tensors`` in memory, where
        the caller has them (None: read them from the directory)."""

    def preflight(self, directory: Path, like: Path | None) -> None:
        """Refuse weights vLLM could not load whole (CheckpointError), before any replica is
        touched; ``like``: the checkpoint serving now, whose tensors they must cover."""

    def before_pause(
        self, replicas: Replicas, client: httpx.Client, upstream: str, directory: Path
    ) -> None:
        """Work for one replica that need not wait for it to pause."""

    def load(
        self,
        replicas: Replicas,
        client: httpx.Client,
        upstream: str,
        directory: Path,
        retries: int | None,
    ) -> None:
        """Put ``directory``'s weights into the paused replica, its prefix cache reset."""

    def checkpoint_weights(self, directory: Path) -> contextlib.AbstractContextManager[Any]:
        """The checkpoint side of the exact weight check (learner.swap.weight_check)."""

    def close(self) -> None:
        """Free what the transport holds (e.g. a weight file the size of the model)."""


class DiskReload:
    """Each replica reloads the checkpoint from disk (vLLM's ``reload_weights``). The path is
    sent as is, so the replicas must see it at the same path (one machine, or a shared
    volume). ``check_files=False`` skips the file check before the swap (tests use it to
    show that the probe catches the same faults)."""

    def __init__(self, check_files: bool = True) -> None:
        self.check_files = check_files

    def stage(
        self, directory: Path, version: str, tensors: Mapping[str, torch.Tensor] | None
    ) -> None:
        pass

    def preflight(self, directory: Path, like: Path | None) -> None:
        if self.check_files:
            from learner.checkpoint import validate_checkpoint  # torch: only here

            validate_checkpoint(directory, like=like)

    def before_pause(
        self, replicas: Replicas, client: httpx.Client, upstream: str, directory: Path
    ) -> None:
        pass

    def load(
        self,
        replicas: Replicas,
        client: httpx.Client,
        upstream: str,
        directory: Path,
        retries: int | None,
    ) -> None:
        replicas.reload(client, upstream, directory, retries)
        replicas.reset_prefix_cache(client, upstream)

    def checkpoint_weights(self, directory: Path) -> contextlib.AbstractContextManager[Any]:
        from learner.swap import weight_check  # torch: only where weights are checked

        return weight_check.reference(directory)

    def close(self) -> None:
        pass


class FullWeightPublisher:
    """All replicas are fenced off together, swapped one after the other and verified; the
    first failure stops the publish and every replica swapped so far gets the last good
    weights back. A version serves only once every replica has verified it.

    A publish ``on`` some of the replicas serves the version there beside the one the others
    serve: a canary's candidate (learner/canary/starts.py). ``canary_replicas`` names them
    until they serve what the others do again (`withdraw`, or a publish on every replica);
    ``last_good`` stays the others' meanwhile. ``last_good_label``: the name the replicas
    serve ``last_good`` under, given to a replica it is put back into after a failure (None:
    its label is left as it is, which is right unless it served other weights before).

    ``last_good`` is the checkpoint the replicas serve now (for the first publish: the
    served model directory, saved with an explicit LM head), and ``last_good_fingerprint``
    its probe: it is reloaded into a replica whose swap failed and verified against that,
    and a new checkpoint's files must cover its tensors. Both move to each checkpoint
    published (or rolled back to) successfully. ``fence``: None only where no proxy serves
    the replicas (tests of the publisher alone). ``transport``: how the weights reach a
    replica (default: `DiskReload`, honouring ``check_files``; a transport given checks
    files as it was told). A rollback and a restore go through the disk, whatever the
    transport. The other settings are the replicas' (learner/swap/replicas.py).
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
        last_good_label: str | None = None,
        fence: Fence | None = None,
        check_files: bool = True,
        check_weights: bool | None = None,
        checked_probe_tolerance: float | None = HALF_PRECISION_CHECKED_TOLERANCE,
        transport: WeightTransport | None = None,
    ) -> None:
        self.replicas = Replicas(
            upstreams,
            probe=probe,
            tolerance=tolerance,
            timeout=timeout,
            retries=retries,
            check_weights=check_weights,
            checked_probe_tolerance=checked_probe_tolerance,
        )
        self.last_good = Path(last_good).resolve() if last_good is not None else None
        self.last_good_fingerprint = last_good_fingerprint
        self.last_good_label = last_good_label
        self.fence = fence
        self.transport: WeightTransport = transport or DiskReload(check_files)
        self.canary_replicas: list[str] = []

    @property
    def upstreams(self) -> list[str]:
        return self.replicas.upstreams

    @property
    def probe(self) -> Probe:
        return self.replicas.probe

    @property
    def tolerance(self) -> float:
        return self.replicas.tolerance

    def publish(
        self,
        checkpoint_dir: Path,
        version: str,
        *,
        expected: ExpectedLogprobs,
        commit: Commit | None = None,
        tensors: Mapping[str, torch.Tensor] | None = None,
        on: Sequence[str] | None = None,
    ) -> PublishResult:
        """Swap ``checkpoint_dir`` into every replica (or those ``on``) as ``version`` and
        verify each. ``tensors``: its weights in memory, for a transport that sends them from
        there (the caller writes the directory after the version serves)."""
        directory = Path(checkpoint_dir).resolve()
        self.transport.stage(directory, version, tensors)
        try:
            reference = functools.partial(self.replicas.reference, expected)
            return self._guarded(directory, version, reference, commit, self._targets(on))
        finally:
            self.transport.stage(directory, version, None)

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
        fingerprint: Fingerprint | None = None,
        commit: Commit | None = None,
        on: Sequence[str] | None = None,
    ) -> PublishResult:
        """Serve an earlier checkpoint again (from the disk) on every replica (or those
        ``on``), verified against its ``fingerprint`` (or the logprobs ``expected`` gives);
        with neither, unverified (tests restoring a server)."""

        def reference() -> Fingerprint | None:
            if fingerprint is not None:
                return fingerprint
            return None if expected is None else self.replicas.reference(expected)

        directory = Path(previous_dir).resolve()
        return self._guarded(directory, previous_version, reference, commit, self._targets(on))

    def withdraw(self, serving: str) -> PublishResult:
        """The replicas a canary's candidate serves on serve ``last_good`` again, labelled
        ``serving`` (what the others serve), verified against its fingerprint; ok at once
        where no candidate serves."""
        if not self.canary_replicas:
            return PublishResult(serving, True, 0.0, None, None, [])
        assert self.last_good is not None, "a candidate was published beside last_good"
        return self.rollback(
            self.last_good, serving, fingerprint=self.last_good_fingerprint, on=self.canary_replicas
        )

    def _targets(self, on: Sequence[str] | None) -> list[str]:
        if on is None:
            return self.upstreams
        targets = [u.rstrip("/") for u in on]
        unknown = sorted(set(targets) - set(self.upstreams))
        if unknown or not targets:
            raise ValueError(f"not replicas of this publisher: {unknown or 'none given'}")
        return targets

    def score(self, upstream: str, reference: Fingerprint, model: str | None = None) -> float:
        """Max |logprob difference| of one replica on ``reference``'s tokens, as served now."""
        return self.replicas.score(upstream, reference, model)

    def serves(self, upstream: str, directory: Path, reference: Fingerprint) -> str | None:
        """None when ``upstream`` serves ``directory``'s weights (compared exactly where it
        can be) and passes ``reference``'s probe; else why not."""
        upstream = upstream.rstrip("/")
        with self.replicas.client() as client:
            try:
                with self.checkpoint_weights(directory) as weights:
                    self.replicas.verify(client, upstream, reference, weights, None, require=False)
            except (PublishError, httpx.HTTPError) as exc:
                return failure_reason(exc)
        return None

    def weights_checkable(self, directory: Path) -> str | None:
        """None when every replica's weights can be compared with ``directory``'s exactly
        (each answers, and every tensor it holds maps onto the checkpoint's and is
        reproducible here; whether they are equal now does not matter); else why not."""
        from learner.swap import weight_check  # torch: only where weights are checked

        with self.replicas.client() as client, weight_check.reference(directory) as reference:
            for upstream in self.upstreams:
                try:
                    report = reference.verify(client, upstream)
                except (weight_check.WeightCheckUnavailable, httpx.HTTPError) as exc:
                    return failure_reason(exc)
                if not report.mappable:
                    return f"{upstream}: {report.summary()}"
        return None

    def close(self) -> None:
        self.transport.close()

    # -- the protocol --------------------------------------------------------------------
    def _guarded(
        self,
        directory: Path,
        version: str,
        reference: Callable[[], Fingerprint | None],
        commit: Commit | None,
        targets: list[str],
    ) -> PublishResult:
        result = PublishResult(version, False, 0.0, None, None, [])
        try:
            result.fingerprint = reference()
        except PublishError as exc:
            result.error = failure_reason(exc)
            return result
        return self._publish(directory, version, result, commit, targets)

    def _publish(
        self,
        directory: Path,
        version: str,
        result: PublishResult,
        commit: Commit | None,
        targets: list[str],
    ) -> PublishResult:
        with self.replicas.client() as client:
            try:
                self.transport.preflight(directory, self.last_good)
                self._fence_close(client, targets)
            except Exception as exc:  # nothing was touched
                result.error = failure_reason(exc)
                # refused files or a fence that gave up reopen the gates themselves; after
                # anything else (the store went away) they may still be closed
                result.restored = isinstance(exc, CheckpointError | FenceError)
                return result
            touched: list[str] = []  # paused for a load, finished or not
            try:
                self._swap_all(client, directory, result, targets, touched)
                if result.fingerprint is not None:
                    with self.checkpoint_weights(directory) as weights:
                        self.replicas.verify_all(
                            client, result.fingerprint, result, weights, upstreams=targets
                        )
                if commit is not None:
                    commit(result)
            except BaseException as exc:
                result.error = failure_reason(exc)
                result.restored = self._restore(client, result.replicas, touched, targets)
                if not isinstance(exc, (httpx.HTTPError, PublishError, CheckpointError)):
                    raise  # the caller's own failure (commit): it must see it
                return result
            result.ok = True
            self._served(directory, version, result.fingerprint, targets)
            self._label_and_open(client, version, result, targets)
        return result

    def _served(
        self, directory: Path, version: str, fingerprint: Fingerprint | None, targets: list[str]
    ) -> None:
        """What the replicas serve after a verified publish on ``targets``."""
        if set(targets) == set(self.upstreams):
            self.last_good, self.last_good_fingerprint = directory, fingerprint
            self.last_good_label = version
            self.canary_replicas = []
        elif directory == self.last_good:  # the others' weights again: withdrawn
            self.canary_replicas = [u for u in self.canary_replicas if u not in targets]
        else:
            self.canary_replicas = list(targets)

    def _fence_close(self, client: httpx.Client, targets: list[str]) -> None:
        if self.fence is not None:
            self.fence.close(
                targets,
                abort_stragglers=lambda u: self.replicas.abort(client, u),
                known=self.upstreams,
            )

    def _fence_open(self, version: str | None, targets: list[str]) -> None:
        if self.fence is not None:
            self.fence.open(targets, version)

    def _label_and_open(
        self, client: httpx.Client, version: str, result: PublishResult, targets: list[str]
    ) -> None:
        """Verified and recorded: the replicas take the version's name, then the traffic."""
        try:
            for upstream in targets:
                self.replicas.label(client, upstream, version)
            self._fence_open(version, targets)
        except Exception as exc:  # vLLM or the store went away just now
            result.opened = False
            result.error = f"verified and recorded, but not yet serving: {failure_reason(exc)}"

    def _restore(
        self, client: httpx.Client, swapped: list[str], touched: list[str], targets: list[str]
    ) -> bool:
        """Put the last good weights back where the new ones went (from the disk), verify the
        ``targets`` against their probe (all but a canary's candidate replicas this publish
        did not pause: they hold other weights by design), label those it paused (``touched``)
        as the last good version where its name is known, and only then open the gates.
        False: they stay closed (a replica gone, say: restored once it is back)."""
        try:
            if self.last_good is not None:
                for upstream in swapped:
                    self._swap(client, upstream, self.last_good, MUST_SUCCEED_RETRIES)
            if self.last_good_fingerprint is not None:
                scratch = PublishResult("restore", False, 0.0, None, None, [])
                # a replica restarted without the extension is still restored, by the probe
                with self.checkpoint_weights(self.last_good) as weights:
                    self.replicas.verify_all(
                        client,
                        self.last_good_fingerprint,
                        scratch,
                        weights,
                        require=False,
                        upstreams=[
                            u for u in targets if u in touched or u not in self.canary_replicas
                        ],
                    )
            elif swapped:
                log.warning("restored %s without a probe to verify it against", self.last_good)
            if self.last_good_label is not None and touched:
                # a replica that served other weights before (a canary's candidate) must not
                # keep their name for the last good weights it holds now
                for upstream in touched:
                    self.replicas.label(client, upstream, self.last_good_label)
                self._fence_open(self.last_good_label, touched)
            self._fence_open(None, [u for u in targets if u not in touched])
            return True
        except Exception as exc:
            log.error(
                "could not restore the last good weights (%s): the replicas stay fenced off "
                "until the serving version is published again",
                failure_reason(exc),
            )
            return False

    def _swap_all(
        self,
        client: httpx.Client,
        directory: Path,
        result: PublishResult,
        targets: list[str],
        touched: list[str] | None = None,
    ) -> None:
        start = time.perf_counter()
        try:
            for upstream in targets:
                self._swap(client, upstream, directory, touched=touched)
                result.replicas.append(upstream)
        finally:
            result.swap_seconds = time.perf_counter() - start

    def _swap(
        self,
        client: httpx.Client,
        upstream: str,
        directory: Path,
        retries: int | None = None,
        touched: list[str] | None = None,
    ) -> None:
        """`touched`: where the replica goes once paused (its weights may change from there)."""
        self.transport.before_pause(self.replicas, client, upstream, directory)
        try:
            self.replicas.pause(client, upstream)
            if touched is not None:
                touched.append(upstream)
            self._load_or_repair(client, upstream, directory, retries)
        finally:
            self.replicas.resume(
                client, upstream, retries=max(self.replicas.retries, MUST_SUCCEED_RETRIES)
            )

    def _load_or_repair(
        self,
        client: httpx.Client,
        upstream: str,
        directory: Path,
        retries: int | None,
    ) -> None:
        """Load; on failure put the last good weights back before the resume, so a failed
        load never leaves the replica half-loaded."""
        try:
            self.transport.load(self.replicas, client, upstream, directory, retries)
        except (httpx.HTTPError, PublishError):
            if self.last_good is not None and directory != self.last_good:
                self.transport.load(
                    self.replicas, client, upstream, self.last_good, MUST_SUCCEED_RETRIES
                )
            raise

    def checkpoint_weights(self, directory: Path | None) -> contextlib.AbstractContextManager[Any]:
        """The checkpoint side of the weight check, or None where weights are not checked."""
        if directory is None or self.replicas.check_weights is False:
            return contextlib.nullcontext(None)
        return self.transport.checkpoint_weights(directory)
