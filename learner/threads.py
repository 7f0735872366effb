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
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

LOCAL_NAMES = {"localhost", "0.0.0.0", ""}


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # 0: leave torch's default (one per core)
    why: str  # for the learner's start line


def usable_cores() -> int:
    """The cores this process may run on (taskset, cgroups' cpusets), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
