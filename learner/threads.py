"""How many threads the trainer takes: the cores that vLLM-CPU replicas on this host leave free.

A CPU trainer at torch's default takes one thread per core. Beside a vLLM-CPU replica on the
same cores, that is two busy pools on too few cores, and each waits for the other: on 2
cores a step of 20 SmolLM2 replies took 92 s on 2 threads under continuous traffic, and
25-51 s for 64 replies on 1 (issue 42); unloaded, a step of SmolLM2 beside one busy core took
15.0 s on 1 thread and 25.8 s on 2. So where a replica serves from this host and the trainer
computes on its CPU, the trainer takes half the cores (at least one) and leaves the rest to
vLLM; where every replica is elsewhere, or the trainer has a GPU, torch keeps its default.
While it computes a step under --time-slice auto (the default), the replicas on its host are
paused and the trainer takes every core instead (learner/time_slice.py).
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

LOCAL_NAMES = {"localhost", "0.0.0.0", ""}
OWN_CGROUPS = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # 0: leave torch's default (one per core)
    why: str  # for the learner's start line


def usable_cores(cgroups: Path = Path("/sys/fs/cgroup"), own: Path = OWN_CGROUPS) -> int:
    """The cores this process may run on (taskset, cgroups' cpusets), not the host's count,
    and no more than its CPU quota allows (`docker run --cpus 2`, compose's `cpus`): a
    container on a 64-core host with a quota of 2 has 2 cores' worth of time."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(cgroups, own)
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def cpu_quota(cgroups: Path, own: Path) -> float | None:
    """Cores' worth of CPU time the process's cgroups allow (quota / period): the smallest
    over its own group and every group above it (a systemd slice's CPUQuota binds the
    scopes under it), or None when none is limited or nothing can be read. cgroup v2
    (`cpu.max`: "max 100000" or "200000 100000") and v1 (`cpu.cfs_quota_us`, -1 unlimited,
    over `cpu.cfs_period_us`)."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy
            found += _quotas(cgroups, path, _ratio_v2)
        elif "cpu" in controllers.split(","):
            # the v1 controller's folder: named as the line names it, or plain "cpu"
            mount = next(
                (m for m in (cgroups / controllers, cgroups / "cpu") if m.is_dir()),
                cgroups / controllers,
            )
            found += _quotas(mount, path, _ratio_v1)
    return min(found) if found else None


def _quotas(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas set on the group at `path` under `mount` and on every group above it."""
    parts = [part for part in path.split("/") if part]
    folders = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [q for q in (read(folder) for folder in folders) if q is not None]


def _ratio_v2(folder: Path) -> float | None:
    try:
        limit, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if limit == "max" else _divided(limit, period)


def _ratio_v1(folder: Path) -> float | None:
    try:
        limit = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return None if limit.startswith("-") else _divided(limit, period)


def _divided(limit: str, period: str) -> float | None:
    try:
        value = int(limit) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return value if value > 0 else None


def is_this_host(url: str) -> bool:
    """True when the URL's host is a loopback address or this machine's own name."""
    host = (urlsplit(url).hostname or "").lower()
    if host in LOCAL_NAMES or host == socket.gethostname().lower():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_threads(
    requested: int,
    upstreams: Sequence[str],
    *,
    cores: int,
    on_gpu: bool,
    sharded: bool = False,
) -> ThreadChoice:
    """The trainer's torch threads: `requested` when set (> 0); else half the `cores` when a
    replica serves from this host and the trainer runs on the CPU; else torch's default
    (`sharded`: torchrun's ranks, which set their own)."""
    if requested > 0:
        return ThreadChoice(requested, f"{requested} (--torch-threads)")
    if sharded:
        return ThreadChoice(0, "torchrun's (each rank of a sharded trainer sets its own)")
    if on_gpu:
        return ThreadChoice(0, "torch's default (the trainer computes on the GPU)")
    local = [u for u in upstreams if is_this_host(u)]
    if not local:
        return ThreadChoice(0, f"torch's default, {cores} (no replica on this host)")
    threads = max(1, cores // 2)
    return ThreadChoice(
        threads,
        f"{threads} of {cores} cores: {len(local)} vLLM replica(s) on this host take the "
        "rest (--torch-threads to choose)",
    )
