"""vLLM's side of the `transfer` transport on CPUs: a weight-transfer engine that loads weights
from a shared-memory file the learner writes (learner/swap/transfer.py).

vLLM runs this, not the learner: `learner.swap.vllm_plugin` registers it as the backend
``onthejob_shm`` in every vLLM process (a general plugin, installed with the package), and
``--weight-transfer-config '{"backend": "onthejob_shm"}'`` selects it. The protocol and calls
are vLLM's own (init, start, update, finish), as for its NCCL engine on GPUs; only the data
plane differs: each replica has a file in memory (``/dev/shm``) that holds the checkpoint's
tensors, which the learner fills (whole, or only the elements that changed) before it asks
for the update. The update loads them into staging tensors kept between updates and repacks
each layer's kernel as vLLM's processing does (learner/swap/vllm_direct_load.py); where a
model's layers are not all understood there, through vLLM's layerwise reload, which rebuilds
the kernels as a reload from disk does.

Imports only torch and vLLM: it runs inside vLLM's worker.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

log = logging.getLogger("onthejob.vllm_plugin")
LAYERWISE_FALLBACK = (
    "onthejob_shm: this model's layers are not all ones a direct load knows; weight updates "
    "go through vLLM's layerwise reload (slower)"
)
PROTOCOL = 1  # bumped when the update's fields change; both sides must agree


@dataclass
class SharedMemoryInitInfo(WeightTransferInitInfo):
    """The replica's weight file, made by the learner."""

    path: str
    protocol: int = PROTOCOL


@dataclass
class SharedMemoryUpdateInfo(WeightTransferUpdateInfo):
    """Where each checkpoint tensor lies in the weight file: byte offset, dtype, shape."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]
    size: int = 0  # the file's size in bytes, as the learner wrote it

    def __post_init__(self) -> None:
        count = len(self.names)
        if not (len(self.dtype_names) == len(self.shapes) == len(self.offsets) == count):
            raise ValueError("names, dtype_names, shapes and offsets must have one entry each")


class SharedMemoryTransferEngine(
    WeightTransferEngine[SharedMemoryInitInfo, SharedMemoryUpdateInfo]
):
    """Loads checkpoint tensors from the replica's weight file (see the module's doc)."""

    init_info_cls = SharedMemoryInitInfo
    update_info_cls = SharedMemoryUpdateInfo
    supports_draft_weight_update = False

    path: str | None = None
    # how updates load: a DirectLoad, False for vLLM's layerwise reload, None: not decided
    direct: Any = None

    def init_transfer_engine(self, init_info: SharedMemoryInitInfo) -> None:
        if init_info.protocol != PROTOCOL:
            raise ValueError(
                f"weight transfer protocol {init_info.protocol}, this replica's is {PROTOCOL}: "
                "the learner and vLLM run different versions of onthejob"
            )
        if not os.access(init_info.path, os.R_OK):
            # another machine or container: the learner falls back to the disk
            raise ValueError(f"cannot read {init_info.path} from this replica")
        self.path = init_info.path

    def start_weight_update(self) -> None:
        if self.direct is None:
            from learner.swap.vllm_direct_load import DirectLoad

            try:
                self.direct = DirectLoad.plan(self.model) or False
            except Exception:  # another vLLM's internals: its own reload still works
                log.exception("onthejob_shm: no plan for a direct load")
                self.direct = False
            if not self.direct:
                log.warning(LAYERWISE_FALLBACK)
        if self.direct:
            return
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class synchronizes an accelerator afterwards; a CPU has none
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SharedMemoryUpdateInfo) -> None:
        if self.path is None:
            raise RuntimeError("init_weight_transfer_engine first: no weight file yet")
        size = update_info.size or os.path.getsize(self.path)
        buffer = torch.from_file(self.path, shared=True, size=size, dtype=torch.uint8)
        weights = []
        for name, dtype_name, shape, offset in zip(
            update_info.names,
            update_info.dtype_names,
            update_info.shapes,
            update_info.offsets,
            strict=True,
        ):
            dtype = getattr(torch, dtype_name)
            nbytes = math.prod(shape) * dtype.itemsize
            if offset < 0 or offset + nbytes > size:
                raise ValueError(f"{name} lies outside the weight file ({offset}+{nbytes}>{size})")
            weights.append((name, buffer[offset : offset + nbytes].view(dtype).view(shape)))
        if self.direct:
            with self._layerwise_after_a_failure():
                self.direct.load(self.model, weights)
            return
        self.model.load_weights(weights)

    def finish_weight_update(self) -> None:
        if self.direct:
            with self._layerwise_after_a_failure():
                self.direct.finish()
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    @contextlib.contextmanager
    def _layerwise_after_a_failure(self) -> Iterator[None]:
        """A direct load that fails leaves the model half loaded: the learner restores it
        from disk, and the next updates go through vLLM's layerwise reload."""
        try:
            yield
        except BaseException:
            log.exception("onthejob_shm: direct load failed; using the layerwise reload")
            self.direct = False
            raise

    def shutdown(self) -> None:
        self.path = None
