"""The `transfer` transport: swaps through vLLM's weight-transfer API, not through the disk.

Same protocol as a full reload (learner/swap/full_publisher.py): fence, pause (keep), load, reset
the prefix cache, resume, verify, record, label, open. Only the load differs: instead of
``reload_weights`` from a checkpoint directory, each replica gets vLLM's
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights`` and
``/finish_weight_update``, and its engine reads the tensors from the replica's weight file in
shared memory (learner/swap/weight_file.py; vLLM's side: learner/swap/vllm_transfer.py), written
whole or as a delta. The weights are checked exactly against the trainer's tensors in memory,
as a disk swap checks them against the files.

The checkpoint is still written, after the version serves (learner/loop/publish.py): rollbacks,
restores and resumes read it, and a restore always goes through the disk, after which the
replica's next transfer is a full sync.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import httpx
import torch

from learner.layout import CheckpointError
from learner.swap.full_publisher import DiskReload, FullWeightPublisher
from learner.swap.publisher import PublishError, failure_reason, server_config
from learner.swap.replicas import Replicas
from learner.swap.shared_memory import default_directory
from learner.swap.vllm_plugin import BACKEND
from learner.swap.weight_file import WeightFile, WriteStats, file_for


class TransferMetrics(TypedDict, total=False):
    """What sending the weights from memory took (none where the replicas read files)."""

    transfer_bytes: int
    transfer_full_syncs: int
    transfer_write_seconds: float
    transfer_changed_share: float


@dataclass
class TransferPhases:
    """Seconds of one replica's transfer, by phase, and what was written."""

    write: WriteStats
    start: float = 0.0
    update: float = 0.0
    finish: float = 0.0


class WeightFileTransfer:
    """The transport (learner/swap/full_publisher.py's `WeightTransport`): weights staged in
    memory go to each replica through its weight file in ``weight_dir`` (default: shared
    memory), as a delta where its last write is known (``delta``); anything else (a rollback,
    a restore, a repair) is reloaded from the disk, after which the replica's next transfer
    is a full sync. ``check_files``: the disk's file check, as `DiskReload`'s."""

    def __init__(
        self,
        upstreams: list[str],
        *,
        weight_dir: Path | None = None,
        delta: bool = True,
        check_files: bool = True,
    ) -> None:
        directory = Path(weight_dir) if weight_dir is not None else default_directory()
        self.files = {
            u.rstrip("/"): WeightFile(file_for(directory, u.rstrip("/"))) for u in upstreams
        }
        self.delta = delta
        self.disk = DiskReload(check_files)
        self.last_phases: dict[str, TransferPhases] = {}
        self._staged: tuple[Path, str, Mapping[str, torch.Tensor]] | None = None

    def stage(
        self, directory: Path, version: str, tensors: Mapping[str, torch.Tensor] | None
    ) -> None:
        if tensors is None:
            self._staged = None
            return
        self.last_phases = {}
        self._staged = (Path(directory).resolve(), version, tensors)

    def close(self) -> None:
        """Remove the weight files (they hold a copy of the model in memory)."""
        for weight_file in self.files.values():
            weight_file.remove()

    def _staged_for(self, directory: Path | None) -> Mapping[str, torch.Tensor] | None:
        if self._staged is None or directory is None:
            return None
        return self._staged[2] if Path(directory).resolve() == self._staged[0] else None

    def preflight(self, directory: Path, like: Path | None) -> None:
        tensors = self._staged_for(directory)
        if tensors is None:
            self.disk.preflight(directory, like)
            return
        # what validate_checkpoint checks of files: no NaN or infinity (either makes the
        # tensor's sum non-finite). Summed in the tensor's own dtype: for bf16 a fifth of
        # the time of a float32 accumulation (0.021 s against 0.096 s for 145M elements) and
        # a tenth of isfinite().all(); a finite sum that overflows is looked at again below
        floating = [(n, t) for n, t in tensors.items() if t.is_floating_point()]
        sums = torch.stack([t.sum().float() for _, t in floating])
        if not bool(torch.isfinite(sums).all()):
            bad = [n for (n, t) in floating if not bool(torch.isfinite(t).all())]
            if bad:  # nothing was touched yet: the replicas serve on
                raise CheckpointError(f"NaN or infinite values in {', '.join(bad[:4])}")

    def before_pause(
        self, replicas: Replicas, client: httpx.Client, upstream: str, directory: Path
    ) -> None:
        tensors = self._staged_for(directory)
        if tensors is None:
            return
        assert self._staged is not None
        # before the pause: the replica reads the file only when asked to update, and a
        # write just after vLLM paused took ten times as long (1.0 s against 0.07 s)
        try:
            write = self.files[upstream].write(tensors, self._staged[1], delta=self.delta)
        except BaseException:
            self.files[upstream].forget()
            raise
        self.last_phases[upstream] = TransferPhases(write)

    def load(
        self,
        replicas: Replicas,
        client: httpx.Client,
        upstream: str,
        directory: Path,
        retries: int | None,
    ) -> None:
        weight_file = self.files[upstream]
        if self._staged_for(directory) is None:
            weight_file.forget()  # the replica reloads from the disk: the next write is whole
            self.disk.load(replicas, client, upstream, directory, retries)
            return
        try:
            self._transfer(replicas, client, upstream, self.last_phases[upstream])
            replicas.reset_prefix_cache(client, upstream)
        except BaseException:
            weight_file.forget()
            raise

    def _transfer(
        self, replicas: Replicas, client: httpx.Client, upstream: str, phases: TransferPhases
    ) -> None:
        """vLLM's protocol: the replica loads its weight file, written already."""
        weight_file = self.files[upstream]
        # every time: cheap, and a replica restarted since the last swap needs it
        replicas.call(
            client,
            "POST",
            upstream + "/init_weight_transfer_engine",
            json={"init_info": weight_file.init_info()},
        )
        started = time.perf_counter()
        replicas.call(client, "POST", upstream + "/start_weight_update", json={})
        updating = time.perf_counter()
        body = {"update_info": weight_file.update_info()}
        replicas.call(client, "POST", upstream + "/update_weights", json=body)
        finishing = time.perf_counter()
        replicas.call(client, "POST", upstream + "/finish_weight_update", json={})
        phases.start, phases.update = updating - started, finishing - updating
        phases.finish = time.perf_counter() - finishing

    def checkpoint_weights(self, directory: Path) -> contextlib.AbstractContextManager[Any]:
        tensors = self._staged_for(directory)
        if tensors is None:
            return self.disk.checkpoint_weights(directory)
        return _in_memory_reference(tensors)


def transfer_publisher(
    upstreams: list[str],
    *,
    weight_dir: Path | None = None,
    delta: bool = True,
    check_files: bool = True,
    **settings: Any,
) -> FullWeightPublisher:
    """A full-weight publisher on the transfer transport; ``settings``: the publisher's."""
    transport = WeightFileTransfer(
        upstreams, weight_dir=weight_dir, delta=delta, check_files=check_files
    )
    return FullWeightPublisher(upstreams, transport=transport, **settings)


@contextlib.contextmanager
def _in_memory_reference(tensors: Mapping[str, torch.Tensor]) -> Iterator[Any]:
    from learner.swap import weight_check

    yield weight_check.Reference(weight_check.DictTensors(tensors))


def transfer_support(
    upstreams: list[str], *, weight_dir: Path | None = None, timeout: float = 120
) -> str | None:
    """None when every replica can take a transfer: it runs our weight-transfer engine (vLLM's
    dev-mode ``GET /server_info``) and reads its weight file where the learner writes it (a
    handshake on an empty file: a replica on another machine or in another container
    cannot); else why not."""
    directory = Path(weight_dir) if weight_dir is not None else default_directory()
    for upstream in upstreams:
        upstream = upstream.rstrip("/")
        try:
            config = server_config(upstream, timeout=timeout).get("weight_transfer_config")
        except PublishError as exc:
            return f"{upstream}: no server info ({exc})"
        backend = config.get("backend") if isinstance(config, dict) else None
        if backend != BACKEND:
            return (
                f"{upstream} runs no {BACKEND} weight-transfer engine (start vLLM with "
                f'--weight-transfer-config \'{{"backend": "{BACKEND}"}}\')'
                if backend is None
                else f"{upstream} runs the {backend} weight-transfer engine, not {BACKEND}"
            )
        weight_file = WeightFile(file_for(directory, upstream))
        made = not weight_file.path.exists()
        try:
            if made:
                weight_file.write({}, "empty", delta=False)
            answer = httpx.post(
                upstream + "/init_weight_transfer_engine",
                json={"init_info": weight_file.init_info()},
                timeout=timeout,
            )
        except (OSError, httpx.HTTPError) as exc:
            return f"{upstream}: weight-transfer handshake failed ({failure_reason(exc)})"
        finally:
            if made:  # the publisher writes the real one, and inits again, at each swap
                weight_file.remove()
        if not answer.is_success:
            return (
                f"{upstream} cannot read {weight_file.path} (HTTP {answer.status_code}: "
                f"{answer.text[:200]}): it runs on another machine or in another container"
            )
    return None
