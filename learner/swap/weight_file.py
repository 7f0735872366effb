"""One replica's weight file: the checkpoint's tensors, in memory, shared with vLLM.

The learner writes the file; the replica's weight-transfer engine (learner/swap/vllm_transfer.py)
loads from it. Between two versions the learner writes only the elements that changed (a
delta): after one optimizer step most bf16 weights round to what they were. What the file
holds is known only while this process wrote all of it; after a failure, or in a new process,
the next write is whole (a full sync).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch

from learner.swap.vllm_plugin import BACKEND

ALIGN = 64  # bytes: every tensor starts on a cache line
# elements compared bit for bit, so that -0.0 and NaN payloads count as changes too
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
INDEX_BYTES = 4  # a sparse patch sends an int32 index beside each value


class WeightFileInit(TypedDict):
    """The ``init_info`` of vLLM's weight transfer (vllm_transfer.SharedMemoryInitInfo)."""

    path: str


class WeightFileUpdate(TypedDict):
    """The ``update_info`` of vLLM's weight transfer (vllm_transfer.SharedMemoryUpdateInfo):
    where each tensor lies in the file."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    size: int


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class WriteStats:
    """What one write put into the file."""

    full: bool  # the whole checkpoint, not a delta
    bytes_sent: int  # whole tensors, or an (index, value) pair per changed element
    bytes_full: int  # the checkpoint's size: what a full sync writes
    changed: int  # elements that differ from what the file held (a full sync: all)
    elements: int
    seconds: float

    def summary(self) -> str:
        kind = "full sync" if self.full else "delta"
        share = self.bytes_sent / self.bytes_full if self.bytes_full else 0.0
        return (
            f"{kind}: {self.bytes_sent / 1e6:.1f} of {self.bytes_full / 1e6:.1f} MB "
            f"({share:.1%}), {self.changed:,} of {self.elements:,} elements changed, "
            f"written in {self.seconds:.2f}s"
        )


def file_for(directory: Path, upstream: str) -> Path:
    digest = hashlib.sha256(upstream.rstrip("/").encode()).hexdigest()[:12]
    return Path(directory) / f"onthejob-{BACKEND}-{digest}.weights"


class WeightFile:
    """The file of one replica, and what this process knows it holds."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.layout: dict[str, Slot] = {}
        self.version: str | None = None  # None: unknown, the next write is whole
        self.size = 0
        # the file's mapping, kept between writes: mapping it afresh faults every page in
        # again at the next write (0.055 s against 0.03 s for SmolLM2's 326 MB)
        self._mapped: tuple[int, int, torch.Tensor] | None = None  # inode, size, bytes

    def forget(self) -> None:
        """What the file holds is no longer known (a failed swap, a replica restored)."""
        self.version = None

    def remove(self) -> None:
        self.forget()
        self._mapped = None
        self.path.unlink(missing_ok=True)

    def write(
        self, tensors: Mapping[str, torch.Tensor], version: str, *, delta: bool = True
    ) -> WriteStats:
        """Make the file hold ``tensors``: only what changed when it holds a known version
        of the same layout (and ``delta``), else all of it. ``version`` is what it holds
        once the write has finished; until then it holds nothing known."""
        start = time.perf_counter()
        layout = _layout(tensors)
        full = not delta or self.version is None or layout != self.layout
        self.version = None  # a write cut short leaves a mix
        if full:
            self.layout, self.size = layout, _size(layout)
            _allocate(self.path, self.size)  # the pages of a file of that size are reused
        buffer = self._buffer()
        sent = changed = elements = 0
        for name, tensor in tensors.items():
            slot = self.layout[name]
            target = buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype)
            source = tensor.detach().to("cpu").reshape(-1)
            elements += source.numel()
            if full:
                target.copy_(source)
                sent += slot.nbytes
                changed += source.numel()
                continue
            bits = _BITS[slot.dtype.itemsize]
            where = (target.view(bits) != source.view(bits)).nonzero().squeeze(1)
            count = where.numel()
            changed += count
            # a patch of (index, value) pairs, or the whole tensor where that is smaller
            patch_bytes = count * (INDEX_BYTES + slot.dtype.itemsize)
            if patch_bytes >= slot.nbytes:
                target.copy_(source)
                sent += slot.nbytes
            elif count:
                target.index_copy_(0, where, source.index_select(0, where))
                sent += patch_bytes
        self.version = version
        return WriteStats(
            full=full,
            bytes_sent=sent,
            bytes_full=sum(slot.nbytes for slot in self.layout.values()),
            changed=changed,
            elements=elements,
            seconds=time.perf_counter() - start,
        )

    def _buffer(self) -> torch.Tensor:
        """The file's bytes, mapped shared; the mapping of the last write while the file is
        the same one (a replaced file, of another size, is mapped anew)."""
        inode = os.stat(self.path).st_ino
        if self._mapped is None or self._mapped[:2] != (inode, self.size):
            buffer = torch.from_file(str(self.path), shared=True, size=self.size, dtype=torch.uint8)
            self._mapped = (inode, self.size, buffer)
        return self._mapped[2]

    def init_info(self) -> WeightFileInit:
        return {"path": str(self.path)}

    def update_info(self) -> WeightFileUpdate:
        names = list(self.layout)
        return {
            "names": names,
            "dtype_names": [str(self.layout[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(self.layout[n].shape) for n in names],
            "offsets": [self.layout[n].offset for n in names],
            "size": self.size,
        }


def _layout(tensors: Mapping[str, torch.Tensor]) -> dict[str, Slot]:
    layout: dict[str, Slot] = {}
    offset = 0
    for name, tensor in tensors.items():
        slot = Slot(tensor.dtype, tuple(tensor.shape), offset)
        layout[name] = slot
        offset += -(-slot.nbytes // ALIGN) * ALIGN
    return layout


def _size(layout: Mapping[str, Slot]) -> int:
    return max((s.offset + s.nbytes for s in layout.values()), default=0) or 1


def _allocate(path: Path, size: int) -> None:
    """A file of ``size`` bytes at ``path``. One of that size is kept: a new file's pages are
    faulted in and zeroed as they are first written, which took ten times the copy itself
    (1.0 s against 0.1 s for SmolLM2's 326 MB in /dev/shm)."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == size:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".new")
    with open(tmp, "wb") as handle:
        handle.truncate(size)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
