"""What waking a process on another CPU costs on this host: a one-byte pipe ping-pong
between two processes, on two CPUs and on one.

Why the proxy benchmarks print it: every call through the proxy wakes the upstream and the
client on the other CPU several times, and on some virtual machines each such wake-up costs
tens of microseconds of the sender's CPU (an inter-processor interrupt that exits to the
hypervisor). Two hosts of the same CPU model then differ 2x in proxy req/s; this figure
says which kind of host a run had.
"""

from __future__ import annotations

import os
import time


def round_trip_us(cpu_a: int, cpu_b: int, rounds: int = 5000) -> float:
    """Mean round trip in µs of one byte there and back, the parent on cpu_a, the child on
    cpu_b (-1: leave where the scheduler puts it)."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: echo every byte back, then leave without cleanup handlers
        try:
            if cpu_b >= 0:
                os.sched_setaffinity(0, {cpu_b})
            for _ in range(rounds):
                os.read(to_child_r, 1)
                os.write(to_parent_w, b"x")
        finally:
            os._exit(0)
    previous = os.sched_getaffinity(0)
    try:
        if cpu_a >= 0:
            os.sched_setaffinity(0, {cpu_a})
        start = time.perf_counter()
        for _ in range(rounds):
            os.write(to_child_w, b"x")
            os.read(to_parent_r, 1)
        elapsed = time.perf_counter() - start
    finally:
        os.sched_setaffinity(0, previous)
        os.waitpid(pid, 0)
        for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
            os.close(fd)
    return elapsed / rounds * 1e6


def describe(cpus: list[int]) -> str:
    """One line for a benchmark's header; cross-CPU only when there are two CPUs to use."""
    same = round_trip_us(cpus[0], cpus[0])
    if len(cpus) < 2:
        return f"host: pipe round trip {same:.1f} us on one CPU"
    cross = round_trip_us(cpus[0], cpus[1])
    return (
        f"host: pipe round trip {cross:.1f} us between CPUs {cpus[0]} and {cpus[1]}, "
        f"{same:.1f} us on one (cross-CPU wake-ups cost the proxy more on a slow host)"
    )


if __name__ == "__main__":
    print(describe(sorted(os.sched_getaffinity(0))))
