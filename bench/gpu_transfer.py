"""A weight transfer from a trainer process to a receiver process on one device, against the
device's own copy speed: the third figure of bench/gpu_check.py, run by it as a process of
its own (``python -m bench.gpu_transfer --plan JSON``; it prints one JSON line, last).

Both processes hold the model's tensors (bf16, the shapes the plan names): the trainer's
filled, the receiver's empty. Each transfer packs the trainer's tensors into buckets of at
most ``bucket_bytes``, moves the buckets to the receiver and unpacks them into its tensors;
it is timed on the trainer from the first pack until the receiver holds every tensor (its
device synchronised). The ways, tried in this order under ``way: auto``:

  collective  torch.distributed, two ranks: a broadcast per bucket from rank 0. NCCL on a GPU
              (both ranks on the one device), gloo on the CPU.
  ipc         where the collective fails (NCCL refuses two ranks on one GPU as a "duplicate
              GPU"): the trainer's buckets are shared once through torch.multiprocessing (CUDA
              IPC on a GPU, shared memory on the CPU); each transfer packs into them and the
              receiver unpacks from them.

The last transfer is checked: the receiver's tensors must sum exactly as the trainer's. The
copy speed is ``dst.copy_(src)`` of one buffer of the model's size on the same device (GB
copied per second). Invariant: only torch is imported here, since every peer is a spawned
process that imports this module.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Plan:
    shapes: list[list[int]]  # the model's tensors, each once (tied weights once)
    device: str  # "cuda" or "cpu"
    bucket_bytes: int
    warmup: int
    repeats: int
    way: str = "auto"  # "auto", "collective" or "ipc"
    timeout_s: float = 120.0  # for each way's processes, start-up included

    @property
    def nbytes(self) -> int:
        return sum(_numel(s) for s in self.shapes) * DTYPE.itemsize


@dataclass
class Outcome:
    way: str  # what was measured: "nccl", "gloo", "cuda-ipc" or "shared-memory"
    seconds: list[float]
    nbytes: int
    copy_seconds: list[float]
    refused: str | None = None  # why the collective was not measured, where it was not

    @property
    def gbps(self) -> float:
        return self.nbytes / statistics.median(self.seconds) / 1e9

    @property
    def copy_gbps(self) -> float:
        return self.nbytes / statistics.median(self.copy_seconds) / 1e9


class TransferError(Exception):
    """A way failed or ran out of time; the message says which and why."""


def _numel(shape: list[int]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def buckets_of(plan: Plan) -> list[list[int]]:
    """The tensors' indices, in order, grouped into buckets of at most ``bucket_bytes`` (a
    larger tensor goes alone)."""
    groups: list[list[int]] = [[]]
    size = 0
    for index, shape in enumerate(plan.shapes):
        nbytes = _numel(shape) * DTYPE.itemsize
        if groups[-1] and size + nbytes > plan.bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(index)
        size += nbytes
    return groups


def _device(plan: Plan) -> torch.device:
    return torch.device("cuda", 0) if plan.device == "cuda" else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tensors(plan: Plan, filled: bool) -> list[torch.Tensor]:
    device = _device(plan)
    generator = torch.Generator(device=device).manual_seed(0)
    out = []
    for shape in plan.shapes:
        tensor = torch.empty(shape, dtype=DTYPE, device=device)
        if filled:
            tensor.normal_(generator=generator)
        out.append(tensor)
    return out


def _bucket_buffers(plan: Plan, groups: list[list[int]]) -> list[torch.Tensor]:
    return [
        torch.empty(sum(_numel(plan.shapes[i]) for i in g), dtype=DTYPE, device=_device(plan))
        for g in groups
    ]


def _pack(tensors: list[torch.Tensor], group: list[int], bucket: torch.Tensor) -> None:
    torch.cat([tensors[i].reshape(-1) for i in group], out=bucket)


def _unpack(bucket: torch.Tensor, group: list[int], tensors: list[torch.Tensor]) -> None:
    parts = bucket.split([tensors[i].numel() for i in group])
    for i, part in zip(group, parts, strict=True):
        tensors[i].copy_(part.view_as(tensors[i]))


def checksum(tensors: list[torch.Tensor]) -> float:
    """The same bits give the same sum: the order of the reduction is fixed."""
    return float(sum(float(t.double().sum()) for t in tensors))


# -- the collective ------------------------------------------------------------------------


def collective_peer(rank: int, plan: Plan, rendezvous: str, results: Any) -> None:
    """One rank: rank 0 is the trainer, rank 1 the receiver."""
    try:
        _collective(rank, plan, rendezvous, results)
    except Exception as exc:  # the parent decides what a failure means
        results.put(("error", rank, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))


def _collective(rank: int, plan: Plan, rendezvous: str, results: Any) -> None:
    device = _device(plan)
    backend = "nccl" if device.type == "cuda" else "gloo"
    options: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=plan.timeout_s),
        **options,
    )
    try:
        groups = buckets_of(plan)
        tensors, buckets = _tensors(plan, filled=rank == 0), _bucket_buffers(plan, groups)
        seconds = []
        for round_ in range(plan.warmup + plan.repeats):
            dist.barrier()
            start = time.perf_counter()
            for group, bucket in zip(groups, buckets, strict=True):
                if rank == 0:
                    _pack(tensors, group, bucket)
                dist.broadcast(bucket, src=0)
                if rank == 1:
                    _unpack(bucket, group, tensors)
            _sync(device)
            dist.barrier()  # the receiver holds them
            if round_ >= plan.warmup:
                seconds.append(time.perf_counter() - start)
        if rank == 0:
            results.put(("seconds", rank, seconds))
        results.put(("checksum", rank, checksum(tensors)))
        dist.barrier()  # neither leaves while the other may still read
    finally:
        dist.destroy_process_group()


# -- CUDA IPC (shared memory on the CPU) -----------------------------------------------------


def ipc_trainer(plan: Plan, to_receiver: Any, from_receiver: Any, results: Any) -> None:
    try:
        _ipc_trainer(plan, to_receiver, from_receiver, results)
    except Exception as exc:
        results.put(("error", 0, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))


def _ipc_trainer(plan: Plan, to_receiver: Any, from_receiver: Any, results: Any) -> None:
    device = _device(plan)
    groups = buckets_of(plan)
    tensors, buckets = _tensors(plan, filled=True), _bucket_buffers(plan, groups)
    _sync(device)
    to_receiver.put(buckets)  # shared once: handles to the same memory (CUDA IPC, or shm)
    if from_receiver.get(timeout=plan.timeout_s) != "ready":
        raise TransferError("the receiver did not open the shared buckets")
    seconds = []
    for round_ in range(plan.warmup + plan.repeats):
        start = time.perf_counter()
        for group, bucket in zip(groups, buckets, strict=True):
            _pack(tensors, group, bucket)
        _sync(device)
        to_receiver.put("go")
        if from_receiver.get(timeout=plan.timeout_s) != "done":
            raise TransferError("the receiver did not answer")
        if round_ >= plan.warmup:
            seconds.append(time.perf_counter() - start)
    results.put(("seconds", 0, seconds))
    results.put(("checksum", 0, checksum(tensors)))
    to_receiver.put("stop")
    from_receiver.get(timeout=plan.timeout_s)  # it let go of the buckets: ours may go


def ipc_receiver(plan: Plan, from_trainer: Any, to_trainer: Any, results: Any) -> None:
    try:
        device = _device(plan)
        groups = buckets_of(plan)
        tensors = _tensors(plan, filled=False)
        buckets = from_trainer.get(timeout=plan.timeout_s)
        to_trainer.put("ready")
        while from_trainer.get(timeout=plan.timeout_s) == "go":
            for group, bucket in zip(groups, buckets, strict=True):
                _unpack(bucket, group, tensors)
            _sync(device)
            to_trainer.put("done")
        del buckets
        results.put(("checksum", 1, checksum(tensors)))
        to_trainer.put("released")
    except Exception as exc:
        results.put(("error", 1, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))


# -- running the two processes ---------------------------------------------------------------


def _run(plan: Plan, way: str) -> list[float]:
    """Both processes of one way; the transfer seconds, or `TransferError`. They are killed
    once they fail or outlast ``timeout_s``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gpu-transfer-") as tmp:
        if way == "collective":
            rendezvous = str(Path(tmp) / "rendezvous")
            peers = [
                ctx.Process(target=collective_peer, args=(r, plan, rendezvous, results))
                for r in (0, 1)
            ]
        else:
            to_receiver, to_trainer = ctx.Queue(), ctx.Queue()
            peers = [
                ctx.Process(target=ipc_trainer, args=(plan, to_receiver, to_trainer, results)),
                ctx.Process(target=ipc_receiver, args=(plan, to_receiver, to_trainer, results)),
            ]
        for peer in peers:
            peer.start()
        try:
            seconds = _collect(plan, results)
        except BaseException:
            _end(peers, wait_s=0.0)  # a peer left waiting for the other would wait on
            raise
        _end(peers, wait_s=30.0)
        return seconds


def _end(peers: list[Any], wait_s: float) -> None:
    """Each peer exits by itself within ``wait_s``, or is killed."""
    for peer in peers:
        peer.join(timeout=wait_s)
        if peer.is_alive():
            peer.kill()
            peer.join()


def _collect(plan: Plan, results: Any) -> list[float]:
    deadline = time.monotonic() + plan.timeout_s
    seconds: list[float] = []
    sums: dict[int, float] = {}
    while len(sums) < 2 or not seconds:
        try:
            kind, rank, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TransferError(f"no answer within {plan.timeout_s:.0f} s") from None
        if kind == "error":
            raise TransferError(f"rank {rank}: {value}")
        if kind == "seconds":
            seconds = value
        else:
            sums[rank] = value
    if sums[0] != sums[1]:
        raise TransferError(f"the receiver holds other weights (sums {sums[0]} != {sums[1]})")
    return seconds


def copy_seconds(plan: Plan) -> list[float]:
    """``dst.copy_(src)`` of one buffer of the model's size, timed ``repeats`` times."""
    device = _device(plan)
    src = torch.ones(plan.nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = []
    for round_ in range(plan.warmup + plan.repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        if round_ >= plan.warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def measure(plan: Plan) -> Outcome:
    """The collective where it works (or where asked), else IPC, and the copy speed."""
    gpu = plan.device == "cuda"
    collective, ipc = ("nccl", "cuda-ipc") if gpu else ("gloo", "shared-memory")
    refused = None
    if plan.way in ("auto", "collective"):
        try:
            seconds = _run(plan, "collective")
            return Outcome(collective, seconds, plan.nbytes, copy_seconds(plan))
        except TransferError as exc:
            if plan.way == "collective":
                raise
            refused = f"{collective} failed: {exc}"
            print(f"{refused}; measuring {ipc} instead", flush=True)
    seconds = _run(plan, "ipc")
    return Outcome(ipc, seconds, plan.nbytes, copy_seconds(plan), refused)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="a Plan as JSON")
    args = parser.parse_args(argv)
    plan = Plan(**json.loads(args.plan))
    if plan.device == "cuda":  # the ranks find each other on this host only
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    try:
        outcome = measure(plan)
    except TransferError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({**asdict(outcome), "gbps": outcome.gbps, "copy_gbps": outcome.copy_gbps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
