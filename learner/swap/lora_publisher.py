"""Publish LoRA adapters into running vLLM replicas, verified before they serve anyone.

vLLM must run with ``--enable-lora --max-lora-rank R`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``. A version is an adapter loaded under the version's
own name (``/v1/load_lora_adapter``) on top of the base weights the replica serves. The
order is what makes it safe: load -> probe under the adapter's name -> record (``commit``)
-> only then ``/update_weight_version``. The proxy routes traffic to the adapter that
``/weight_info`` names, so no client is ever answered by an adapter that failed its probe,
and a failed publish needs no repair and no fence: the previous version never stopped
serving.

Where adapters load from memory (learner/swap/adapter_memory.py), a new adapter is written
into shared memory and the replicas load that copy, while its checkpoint is copied to the
disk beside; the checkpoint is whole before ``commit`` records the version. A recorded one
(a rollback, a restore) is copied from its checkpoint into memory first.

Full checkpoints still go through the full reload (a base that changed, a rollback to
full weights); a rollback to the base already loaded only relabels it, and reloads it
when the probe shows the weights are not that base after all.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from learner.layout import CheckpointError, is_adapter
from learner.swap.adapter_memory import AdapterFiles, AdapterMemory, AdapterWrite, UnreadableCopy
from learner.swap.full_publisher import FullWeightPublisher
from learner.swap.publisher import (
    DEFAULT_TOLERANCE,
    HALF_PRECISION_CHECKED_TOLERANCE,
    Commit,
    ExpectedLogprobs,
    Fence,
    Fingerprint,
    Probe,
    PublishError,
    PublishResult,
    adapter_paths,
    failure_reason,
)
from store import tenants

log = logging.getLogger("onthejob.learner")

NO_RUNTIME_LORA = (
    "vLLM does not load adapters at runtime: start it with --enable-lora --max-lora-rank R "
    "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
)


# where a tenant's version serves instead of the replicas' weight version (learn --tenants):
# (version, whether it is an adapter; else the base, which the shared policy's name serves)
Label = Callable[[str, bool], None]


def tenant_pointer(engine: Engine, tenant: str) -> Label:
    """A tenant's version serves by the tenant's pointer: the proxies route the tenant's
    calls to the adapter it names (the base: no pointer, the shared policy answers)."""

    def label(version: str, adapter: bool) -> None:
        with engine.begin() as conn:
            tenants.set_serving(
                conn, name=tenant, version=version if adapter else None, now=datetime.now(UTC)
            )

    return label


class LoraPublisher:
    """Adapters, and full checkpoints through a `FullWeightPublisher` on the same replicas
    (``full``). ``keep``: adapters kept loaded (newest first); older ones are unloaded, so a long
    run does not pile them up, while requests that started on the last few finish.
    ``label``: a verified version serves by this instead of by the replicas' weight version
    (a tenant's adapter: the proxies route the tenant's calls to it). ``lineage``: the
    versions of the lineage this publisher serves, newest first (the store's); with it, the
    window covers every adapter of that lineage the replicas list, also those an earlier
    learner or a rollback loaded, which this publisher's own memory never saw.
    ``memory``: where adapters load from memory, their copies there (None: from the
    checkpoint directories, on the disk)."""

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
        max_rank: int | None = None,
        keep: int = 3,
        label: Label | None = None,
        lineage: Callable[[], list[str]] | None = None,
        memory: AdapterMemory | None = None,
    ) -> None:
        self.full = FullWeightPublisher(
            upstreams,
            probe=probe,
            tolerance=tolerance,
            timeout=timeout,
            retries=retries,
            last_good=last_good,
            last_good_fingerprint=last_good_fingerprint,
            last_good_label=last_good_label,
            fence=fence,
            check_files=check_files,
            check_weights=check_weights,
            checked_probe_tolerance=checked_probe_tolerance,
        )
        # one set of replicas, one way to call and verify them, for adapters and the base
        self.replicas = self.full.replicas
        self.check_files = check_files
        self.max_rank = max_rank
        self.keep = max(keep, 1)
        self.label = label
        self.lineage = lineage
        self.memory = memory
        self._loaded: deque[str] = deque()

    @property
    def upstreams(self) -> list[str]:
        return self.replicas.upstreams

    @property
    def probe(self) -> Probe:
        return self.replicas.probe

    @property
    def tolerance(self) -> float:
        return self.replicas.tolerance

    @property
    def last_good(self) -> Path | None:
        """The full checkpoint the replicas' weights are (adapters go on top of it)."""
        return self.full.last_good

    @last_good.setter
    def last_good(self, value: Path | None) -> None:
        self.full.last_good = value

    @property
    def last_good_fingerprint(self) -> Fingerprint | None:
        return self.full.last_good_fingerprint

    @last_good_fingerprint.setter
    def last_good_fingerprint(self, value: Fingerprint | None) -> None:
        self.full.last_good_fingerprint = value

    def score(self, upstream: str, reference: Fingerprint, model: str | None = None) -> float:
        return self.replicas.score(upstream, reference, model)

    def close(self) -> None:
        self.full.close()

    def publish(
        self,
        checkpoint_dir: Path,
        version: str,
        *,
        expected: ExpectedLogprobs,
        commit: Commit | None = None,
        write: AdapterWrite | None = None,
        serve: bool = True,
    ) -> PublishResult:
        """``write``: fills an empty directory with the new adapter's files; given it, the
        publisher writes ``checkpoint_dir`` itself (into memory first where adapters load
        from there), else ``checkpoint_dir`` holds the files already. ``serve`` False: the
        adapter is loaded, verified and recorded, but not labelled: it serves only the calls
        sent to it by name (a canary's candidate, store/canaries.py)."""
        if write is None and not is_adapter(checkpoint_dir):
            return self.full.publish(checkpoint_dir, version, expected=expected, commit=commit)
        result = PublishResult(version, False, 0.0, None, None, [])
        try:
            result.fingerprint = self.replicas.reference(expected)
        except PublishError as exc:
            result.error = failure_reason(exc)
            return result
        files = AdapterFiles(self.memory, Path(checkpoint_dir).resolve(), version, write)
        return self._publish_adapter(files, result, commit, fresh=True, serve=serve)

    def rollback(
        self,
        previous_dir: Path,
        previous_version: str,
        *,
        expected: ExpectedLogprobs | None = None,
        fingerprint: Fingerprint | None = None,
        commit: Commit | None = None,
    ) -> PublishResult:
        previous_dir = Path(previous_dir)
        reference = fingerprint
        if reference is None and expected is not None:
            try:
                reference = self.replicas.reference(expected)
            except PublishError as exc:
                return PublishResult(previous_version, False, 0.0, None, failure_reason(exc))
        result = PublishResult(previous_version, False, 0.0, None, None, [], reference)
        if is_adapter(previous_dir):
            files = AdapterFiles(self.memory, previous_dir.resolve(), previous_version)
            return self._publish_adapter(files, result, commit, fresh=False)
        if self.last_good is not None and previous_dir.resolve() == self.last_good:
            relabelled = self._relabel(result, commit)
            if relabelled.ok:
                return relabelled
            # the base is not what it should be (a full swap that failed its probe): reload
        if self.label is not None:
            # a tenant's lineage never reloads the replicas' weights: they serve everyone
            result.error = f"{previous_version}: a tenant serves adapters or the base only"
            return result
        return self.full.rollback(
            previous_dir, previous_version, fingerprint=reference, commit=commit
        )

    def _publish_adapter(
        self,
        files: AdapterFiles,
        result: PublishResult,
        commit: Commit | None,
        *,
        fresh: bool,
        serve: bool = True,
    ) -> PublishResult:
        version = result.version
        with self.replicas.client() as client, files:
            try:
                directory = files.prepare()
                if self.check_files:
                    from learner.lora import validate_adapter  # torch: only here

                    validate_adapter(directory, max_rank=self.max_rank)
                start = time.perf_counter()
                directory = self._load_all(client, files)
                loaded = time.perf_counter() - start
                if result.fingerprint is not None:
                    self._verify_adapter(client, directory, result)
                files.checkpoint_written()  # on the disk before any record names it
                if commit is not None:
                    commit(result)
            except BaseException as exc:
                result.error = failure_reason(exc)
                if fresh:  # never served: nothing may route to it later by mistake
                    self._unload(client, version)
                    files.discard()
                if not isinstance(exc, (httpx.HTTPError, PublishError, CheckpointError)):
                    raise
                return result
            result.ok = True
            start = time.perf_counter()
            if serve:
                self._label_all(client, result, adapter=True)
            else:
                result.replicas.extend(self.upstreams)  # loaded on each, serving nobody yet
            result.swap_seconds = loaded + time.perf_counter() - start
            self._remember(client, version)
        return result

    def _verify_adapter(self, client: httpx.Client, directory: Path, result: PublishResult) -> None:
        """Every replica: the adapter's weights in its LoRA kernels compared exactly with the
        directory's (learner/swap/adapter_check.py), then the probe under the adapter's name,
        within the looser tolerance in half precision once the weights matched."""
        assert result.fingerprint is not None
        weights = None
        if self.replicas.check_weights is not False:
            from learner.swap.adapter_check import AdapterReference  # torch: only here

            weights = AdapterReference(directory, result.version)
        for upstream in self.upstreams:
            self.replicas.verify(
                client,
                upstream,
                result.fingerprint,
                weights,
                result,
                result.version,
                require=self.replicas.check_weights is True,
            )

    def _relabel(self, result: PublishResult, commit: Commit | None) -> PublishResult:
        """Serve the base weights already loaded again, under the result's version: verified
        under the base model's own name first, then recorded, then labelled."""
        with self.replicas.client() as client:
            try:
                if result.fingerprint is not None:
                    with self.full.checkpoint_weights(self.last_good) as weights:
                        self.replicas.verify_all(client, result.fingerprint, result, weights)
            except (httpx.HTTPError, PublishError) as exc:
                result.error = failure_reason(exc)
                return result
            if commit is not None:
                commit(result)  # raising: nothing was changed, nothing to undo
            result.ok = True
            start = time.perf_counter()
            self._label_all(client, result, adapter=False)
            result.swap_seconds = time.perf_counter() - start
        return result

    def _label_all(self, client: httpx.Client, result: PublishResult, *, adapter: bool) -> None:
        """Make the verified, recorded version serve: by ``label`` where one is set, else as
        every replica's weight version."""
        try:
            if self.label is not None:
                self.label(result.version, adapter)
                result.replicas.extend(self.upstreams)
                return
            for upstream in self.upstreams:
                self.replicas.label(client, upstream, result.version)
                result.replicas.append(upstream)
        except (httpx.HTTPError, SQLAlchemyError) as exc:
            result.opened = False
            result.error = f"verified and recorded, but not yet serving: {failure_reason(exc)}"

    def _load_all(self, client: httpx.Client, files: AdapterFiles) -> Path:
        """Every replica loads ``files``' adapter; the directory they loaded it from (the
        checkpoint's, where a replica could not read the memory copy and auto falls back)."""
        same = (files.loads, files.checkpoint)  # one version's files, wherever they lie
        try:
            for upstream in self.upstreams:
                self._load(client, upstream, files.name, files.loads, same)
        except UnreadableCopy as exc:
            files.from_disk(exc)
            for upstream in self.upstreams:
                self._load(client, upstream, files.name, files.loads, same)
        return files.loads

    def _load(
        self,
        client: httpx.Client,
        upstream: str,
        name: str,
        directory: Path,
        same: tuple[Path, ...] = (),
    ) -> None:
        """Load ``directory`` as adapter ``name`` (already loaded from it or from one of
        ``same``, which hold the same files: kept). Never ``load_inplace``: vLLM keeps that
        flag on the adapter's request, and every engine step that serves the adapter then
        reads it from disk again (64 tokens of SmolLM2 took 7.2 s against 5.7 s), and fails
        once retention has removed its directory. A name that holds other files (a resumed
        learner's) is unloaded first, so the load gives it a new id: requests running on
        the old one finish on its weights, which the replica keeps in memory."""
        try:
            loaded = adapter_paths(self.replicas.call(client, "GET", upstream + "/v1/models"))
            if loaded.get(name) in {str(p) for p in (directory, *same)}:
                return  # these files, under this name, already: the probe verifies them
            if name in loaded:
                body = {"lora_name": name}
                self.replicas.call(client, "POST", upstream + "/v1/unload_lora_adapter", json=body)
            body = {"lora_name": name, "lora_path": str(directory)}
            self.replicas.call(client, "POST", upstream + "/v1/load_lora_adapter", json=body)
        except httpx.HTTPStatusError as exc:
            status, text = exc.response.status_code, exc.response.text
            if status == 404 and self.memory is not None and self.memory.holds(directory):
                if "No adapter found" in text:  # vLLM's LoRAAdapterNotFoundError
                    raise UnreadableCopy(f"{upstream} cannot read {directory}") from exc
            if status in (404, 405):
                raise PublishError(f"{upstream}: {NO_RUNTIME_LORA}") from exc
            raise

    def _unload(self, client: httpx.Client, name: str) -> None:
        for upstream in self.upstreams:
            with contextlib.suppress(httpx.HTTPError):
                body = {"lora_name": name}
                client.post(upstream + "/v1/unload_lora_adapter", json=body)

    def _remember(self, client: httpx.Client, version: str) -> None:
        if version in self._loaded:
            self._loaded.remove(version)
        self._loaded.appendleft(version)
        if self.lineage is not None and self._trim_lineage(client, version):
            return
        while len(self._loaded) > self.keep:
            self._unload(client, self._loaded.pop())

    def _trim_lineage(self, client: httpx.Client, version: str) -> bool:
        """Unload the lineage's adapters the replicas list beyond the newest ``keep``
        (``version``, just verified, first); False where the replicas or the store could
        not be read (this publisher's own memory trims instead)."""
        assert self.lineage is not None
        try:
            listed: set[str] = set()
            for upstream in self.upstreams:
                models = self.replicas.call(client, "GET", upstream + "/v1/models")
                listed |= set(adapter_paths(models))
            newest = [version, *(v for v in self.lineage() if v != version)]
        except (httpx.HTTPError, PublishError, SQLAlchemyError) as exc:
            log.warning("adapters kept loaded: the replicas' list unread (%s)", exc)
            return False
        loaded = [name for name in newest if name in listed]
        for name in loaded[self.keep :]:
            self._unload(client, name)
        self._loaded = deque(loaded[: self.keep])
        return True
