"""The trainer's threads from the cores the replicas on this host leave free."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from learner.threads import choose_threads, is_this_host, usable_cores


def test_replicas_on_loopback_or_this_hosts_name_are_on_this_host() -> None:
    assert is_this_host("http://127.0.0.1:8000")
    assert is_this_host("http://localhost:8000/")
    assert is_this_host("http://[::1]:8000")
    assert is_this_host(f"http://{socket.gethostname()}:8000")
    assert not is_this_host("http://10.0.0.7:8000")
    assert not is_this_host("http://vllm:8000")  # another container or machine


def test_a_cpu_trainer_beside_a_local_replica_takes_half_the_cores() -> None:
    local = ["http://127.0.0.1:8000"]
    assert choose_threads(0, local, cores=2, on_gpu=False).threads == 1
    assert choose_threads(0, local, cores=16, on_gpu=False).threads == 8
    assert choose_threads(0, local, cores=1, on_gpu=False).threads == 1
    assert "1 of 2 cores" in choose_threads(0, local, cores=2, on_gpu=False).why


def test_remote_replicas_a_gpu_a_sharded_trainer_or_a_flag_leave_it_to_others() -> None:
    local, remote = ["http://127.0.0.1:8000"], ["http://vllm:8000"]
    assert choose_threads(0, remote, cores=2, on_gpu=False).threads == 0  # torch's default
    assert choose_threads(0, local, cores=2, on_gpu=True).threads == 0
    assert choose_threads(0, local, cores=2, on_gpu=False, sharded=True).threads == 0
    assert choose_threads(3, local, cores=2, on_gpu=False).threads == 3
    # one local replica among remote ones still shares this host's cores
    assert choose_threads(0, [*remote, *local], cores=4, on_gpu=False).threads == 2


def test_the_cores_counted_are_those_the_process_may_run_on_not_the_hosts() -> None:
    one = min(os.sched_getaffinity(0))
    counted = subprocess.run(
        [sys.executable, "-c", "from learner.threads import usable_cores; print(usable_cores())"],
        preexec_fn=lambda: os.sched_setaffinity(0, {one}),  # as `taskset -c` would
        capture_output=True,
        text=True,
        check=True,
    )
    assert counted.stdout.strip() == "1"
    assert usable_cores() == len(os.sched_getaffinity(0))
